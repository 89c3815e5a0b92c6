"""The device plugin in-process before a fake kubelet, over the in-memory API (``Rig``)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from gpushare.core.model.inventory import Mode
from gpushare.core.model.names import ANN_ASSIGNED
from gpushare.deviceplugin.config import PluginConfig
from gpushare.deviceplugin.plugin import DevicePlugin
from gpushare.extender.driver import ExtenderDriver
from gpushare.kube.cache import ClusterCache
from gpushare.kube.memory import MemoryKube
from gpushare.node.cdi import HandOff
from gpushare.node.enforcement.hook import IsolationHook
from gpushare.node.gpus import FakeGpus
from tests.support import grpc_loop
from tests.support.fake_kubelet import FakeKubelet
from tests.support.rig import rig_for

T = TypeVar("T")
NODE = "gpu-node-1"


MEM = "aliyun.com/gpu-mem"


CORE = "aliyun.com/gpu-core.percentage"


def bare_node(mode: Mode | str) -> dict[str, Any]:
    """The node before the plugin starts: its mode label (a Mode, or any label value) only."""
    label = mode.value if isinstance(mode, Mode) else mode
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NODE, "labels": {"ack.node.gpu.schedule": label}},
        "status": {"capacity": {}, "allocatable": {}},
    }


def pod(
    name: str,
    *sizes: int,
    core: int | None = None,
    gpu_count: int = 1,
    init: int | None = None,
    sidecar: int | None = None,
) -> dict[str, Any]:
    def container(cname: str, size: int) -> dict[str, Any]:
        limits: dict[str, Any] = {MEM: size}
        if core is not None:
            limits[CORE] = core
        return {"name": cname, "image": "x", "resources": {"limits": limits}}

    spec: dict[str, Any] = {
        "schedulerName": "ack-co-scheduler",
        "containers": [container(f"c{i}", s) for i, s in enumerate(sizes)],
    }
    if init is not None:
        spec["initContainers"] = [container("init", init)]
    if sidecar is not None:
        spec.setdefault("initContainers", []).append(
            {**container("sidecar", sidecar), "restartPolicy": "Always"}
        )
    labels = {"aliyun.com/gpu-count": str(gpu_count)} if gpu_count > 1 else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": spec,
    }


@dataclass
class Rig:
    kube: MemoryKube
    cache: ClusterCache
    driver: ExtenderDriver
    kubelet: FakeKubelet
    plugin: DevicePlugin
    gpus: FakeGpus
    root: Path

    async def settle(self) -> None:
        for _ in range(50):
            await asyncio.sleep(0)

    async def place(self, manifest: dict[str, Any]) -> dict[str, Any] | None:
        stored = self.kube.create_pod(manifest)
        await self.settle()
        outcome = await self.driver.schedule(stored, [NODE])
        await self.settle()
        if not outcome.bound:
            return None
        return await self.kube.get_pod("default", manifest["metadata"]["name"])

    def new_plugin(self) -> DevicePlugin:
        return DevicePlugin(
            api=self.kube, source=self.gpus, config=self.plugin.config, hook=self.plugin.hook
        )


def run(body: Callable[[Rig], Awaitable[T]], **kwargs: Any) -> T:
    async def main() -> T:
        async with rig(**kwargs) as r:
            return await asyncio.wait_for(body(r), 60)

    return grpc_loop.run(main())


async def served(r: Rig, name: str) -> bool:
    """Whether the plugin marks the pod served within a few seconds."""
    for _ in range(100):
        stored = await r.kube.get_pod("default", name)
        if stored["metadata"]["annotations"].get(ANN_ASSIGNED) == "true":
            return True
        await asyncio.sleep(0.05)
    return False


@contextlib.asynccontextmanager
async def rig(
    mode: Mode = Mode.SHARE,
    gpus: str = "2x15GiB",
    hook: Callable[[Path, FakeGpus], IsolationHook] | None = None,
    handoff: Callable[[Path], HandOff] | None = None,
) -> AsyncIterator[Rig]:
    root = Path(tempfile.mkdtemp(prefix="gs-", dir="/tmp"))
    kube = MemoryKube()
    kube.put_node(bare_node(mode))
    kubelet = FakeKubelet(root / "dp", root / "podres.sock")
    await kubelet.start()
    source = FakeGpus.parse(gpus, node=NODE)
    config = PluginConfig(
        node=NODE,
        plugin_dir=root / "dp",
        pod_resources_socket=root / "podres.sock",
        state_dir=root / "state",
        check_interval=0.05,
        handoff=handoff(root) if handoff else HandOff(),
    )
    plugin = DevicePlugin(
        api=kube, source=source, config=config, hook=hook(root, source) if hook else None
    )
    await plugin.start()
    await kubelet.wait_listed()
    current: Rig | None = None
    try:
        async with rig_for(kube) as extender:
            current = Rig(kube, extender.cache, extender.driver, kubelet, plugin, source, root)
            yield current
    finally:
        # the test may have replaced the first plugin
        await (current.plugin if current is not None else plugin).stop()
        await kubelet.stop()
        gc.collect()  # let stopped gRPC servers go while their event loop still runs
        await asyncio.sleep(0)
        shutil.rmtree(root, ignore_errors=True)
