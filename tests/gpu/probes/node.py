"""The node path: the device plugin itself, on the machine's NVML, before a kubelet double.

The plugin runs in this process as on a node (``DevicePlugin`` with its isolation hook,
``NodeIsolation``), serving gRPC on unix sockets to the fake kubelet of the integration tests
(``tests/support/fake_kubelet.py``), over the in-memory API server with gpushare's extender
placing the pods. On a GPU its GPUs come from the real NVML (``NvmlGpus``); in rehearsal from the
fake NVML, loaded by path as ``--driver-root`` loads a driver's. What is recorded:

- ``published``: the devices and units kubelet is sent for each resource, their health, and the
  node's labels, annotations and capacity as the plugin wrote them;
- ``allocate_mem_2gib`` and ``allocate_core_30``: kubelet's Allocate answers (envs, mounts) for
  a 2 GiB pod and for a 2 GiB, 30 % ``gpu-core.percentage`` pod on a core_mem node;
- ``held_mem_2gib`` and ``held_core_30``: a process started with exactly that answer, its env
  as given (the GPUs it names in ``NVIDIA_VISIBLE_DEVICES`` made its only ones through
  ``CUDA_VISIBLE_DEVICES``, the runtime's part), and each mount's host file where the container
  would see it. Nothing here can bind
  mount (no root in CI, no CAP_SYS_ADMIN in most GPU boxes), so the container's paths are
  replaced by their host paths: the limits file the plugin wrote is copied, with that change
  alone, to where a per-container copy of the interposer reads it (``setting``), and the broker
  it names is the plugin's own. The 2 GiB pod's process is held to 2 GiB (PyTorch where it is
  importable, else the driver API); the 30 % pod's runs flat out and its share is measured as
  the compute step does.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import shutil
from pathlib import Path
from typing import Any

from gpushare.core.decision.scheduling import Scheduler, Settings
from gpushare.core.model.inventory import Mode
from gpushare.core.model.units import MemoryUnit
from gpushare.deviceplugin.config import PluginConfig
from gpushare.deviceplugin.plugin import DevicePlugin
from gpushare.extender.service import Extender
from gpushare.extender.wire import ExtenderArgs, ExtenderBindingArgs
from gpushare.kube.backoff import Backoff
from gpushare.kube.cache import ClusterCache
from gpushare.kube.memory import MemoryKube
from gpushare.node.cdi import HandOff
from gpushare.node.enforcement.nodehook import NodeIsolation
from gpushare.node.gpus import GpuSource, NvmlGpus
from tests.support.fake_kubelet import Admitted, FakeKubelet

from .figures import Recorder
from .setting import GiB, Setting, modules_missing

NODE = "gpu-node"
MEM = "aliyun.com/gpu-mem"
CORE = "aliyun.com/gpu-core.percentage"
SHOWN_ANNOTATIONS = 2000
"""Characters of each node annotation kept in the figures (the inventory is long)."""


def nvml_source(s: Setting) -> GpuSource:
    """The plugin's NVML reader: the machine's NVML, or the fake one loaded by its path."""
    if s.rehearsal:
        import pynvml

        pynvml.nvmlLib = ctypes.CDLL(s.nvml)  # as --driver-root hands pynvml its library
    return NvmlGpus()


def pod(name: str, gib: int, core: int | None = None) -> dict[str, Any]:
    limits: dict[str, Any] = {MEM: gib}
    if core is not None:
        limits[CORE] = core
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {
            "schedulerName": "ack-co-scheduler",
            "containers": [{"name": "main", "image": "x", "resources": {"limits": limits}}],
        },
    }


def translate(text: str, mounts: list[tuple[str, str, bool]]) -> str:
    """``text`` with each mounted container path replaced by its host path (longest first)."""
    for inside, host, _ in sorted(mounts, key=lambda m: -len(m[0])):
        text = text.replace(inside, host)
    return text


def limits_mount(mounts: list[tuple[str, str, bool]]) -> tuple[str, str] | None:
    """The (container, host) paths of the limits file the answer mounts."""
    for inside, host, _ in mounts:
        if inside.endswith("/limits") and Path(host).is_file():
            return inside, host
    return None


def answer_env(
    s: Setting, admitted: Admitted, container: str, index: int
) -> tuple[dict[str, str], dict[str, Any]]:
    """The env of a process started with ``container``'s answer (see the module), and how."""
    mounts = admitted.mounts.get(container, [])
    envs = dict(admitted.envs.get(container, {}))
    how: dict[str, Any] = {}
    found = limits_mount(mounts)
    if found is None:
        raise RuntimeError(f"the answer mounts no limits file: {mounts}")
    written = Path(found[1]).read_text()
    path = s.limits_path(index)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(translate(written, mounts))
    how["limits_file"] = written
    how["limits_at"] = str(path)
    env = {**s.base_env(), **{k: translate(v, mounts) for k, v in envs.items()}}
    preload = envs.get("LD_PRELOAD", "")
    how["ld_preload_in_answer"] = preload
    # the answer's library reads the container's limits path, compiled in; this copy reads
    # ``path`` instead, built from the same source
    env["LD_PRELOAD"] = str(s.lib_dir / f"c{index}" / "libgpushare-cuda.so")
    # the container runtime's part: only the GPUs the answer names are seen
    if (named := envs.get("NVIDIA_VISIBLE_DEVICES", "")).startswith("GPU-"):
        env["CUDA_VISIBLE_DEVICES"] = named
        how["cuda_visible_devices"] = named
    return env, how


class NodeRig:
    """The plugin, its kubelet, the API and the extender, for one step."""

    def __init__(self, s: Setting, source: GpuSource, mode: Mode) -> None:
        self.mode = mode
        self.root = s.work / f"node-{mode.value}"
        shutil.rmtree(self.root, ignore_errors=True)
        self.kube = MemoryKube()
        self.kube.put_node(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": NODE, "labels": {"ack.node.gpu.schedule": mode.value}},
                "status": {"capacity": {}, "allocatable": {}},
            }
        )
        self.kubelet = FakeKubelet(self.root / "dp", self.root / "podres.sock")
        hook = NodeIsolation(
            policy="auto",
            lib_dir=self.root / "lib",
            state_dir=self.root / "state",
            unit=MemoryUnit.GiB,
            source=source,
            packaged=s.interposer,
        )
        config = PluginConfig(
            node=NODE,
            plugin_dir=self.root / "dp",
            pod_resources_socket=self.root / "podres.sock",
            state_dir=self.root / "state",
            check_interval=0.2,
            handoff=HandOff(),
        )
        self.plugin = DevicePlugin(api=self.kube, source=source, config=config, hook=hook)
        settings = Settings()
        scheduler = Scheduler(settings)
        self.cache = ClusterCache(
            self.kube,
            settings=settings,
            backoff=Backoff(base_s=0.01, cap_s=0.01),
            workload=scheduler.workload,
        )
        self.extender = Extender(api=self.kube, cache=self.cache, scheduler=scheduler)
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.kubelet.start()
        await self.plugin.start()
        await self.kubelet.wait_listed()
        self.task = asyncio.create_task(self.cache.run(self.extender.take))
        await asyncio.sleep(0.2)

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        await self.extender.events.close()
        await self.plugin.stop()
        await self.kubelet.stop()

    async def admit(self, manifest: dict[str, Any]) -> tuple[dict[str, Any], Admitted]:
        """Filter, bind (the extender's annotations), then kubelet's Allocate calls."""
        stored = self.kube.create_pod(manifest)
        await asyncio.sleep(0.2)
        passed = self.extender.filter(ExtenderArgs(Pod=stored, NodeNames=[NODE]))
        if not passed.NodeNames:
            raise RuntimeError(f"the extender refused {manifest['metadata']['name']}: {passed}")
        meta = stored["metadata"]
        bound = await self.extender.bind(
            ExtenderBindingArgs(meta["name"], meta["namespace"], meta.get("uid", ""), NODE)
        )
        if bound.Error:
            raise RuntimeError(f"bind: {bound.Error}")
        await asyncio.sleep(0.3)
        placed = await self.kube.get_pod(meta["namespace"], meta["name"])
        return placed, await asyncio.wait_for(self.kubelet.admit(placed), 30)

    async def published(self) -> dict[str, Any]:
        resources = (MEM, CORE) if self.mode is Mode.CORE_MEM else (MEM,)
        for resource in resources:
            with contextlib.suppress(Exception):
                await self.kubelet.wait_devices(resource, len(self.devices(resource)), timeout=2)
        node = await self.kube.get_node(NODE)
        meta, status = node["metadata"], node.get("status", {})
        return {
            "devices": {
                r: {"count": len(self.devices(r)), "health": sorted(set(self.devices(r).values()))}
                for r in resources
            },
            "labels": meta.get("labels", {}),
            "annotations": {
                k: str(v)[:SHOWN_ANNOTATIONS] for k, v in meta.get("annotations", {}).items()
            },
            "capacity": status.get("capacity", {}),
            "allocatable": status.get("allocatable", {}),
        }

    def devices(self, resource: str) -> dict[str, str]:
        got: dict[str, str] = self.kubelet.devices.get(resource, {})
        return got


def node(s: Setting, rec: Recorder) -> None:
    """The step: see the module."""
    asyncio.run(_node(s, rec))


async def _node(s: Setting, rec: Recorder) -> None:
    from .sampling import NvmlSampler
    from .setting import run_child
    from .steps import OOM, Workload, figure, held, summary

    source = nvml_source(s)
    gpus = source.gpus()
    rec.figure("gpus", {"gpus": [g.__dict__ for g in gpus]})
    r = NodeRig(s, source, Mode.CGPU)
    await r.start()
    try:
        shown = await r.published()
        rec.figure("published_cgpu", shown)
        total_gib = sum(g.memory_mib // 1024 for g in gpus)
        rec.check(
            "node: one gpu-mem device per GiB of every GPU",
            shown["devices"][MEM]["count"] == total_gib,
        )
        rec.check(
            "node: every device Healthy",
            all(v["health"] == ["Healthy"] for v in shown["devices"].values()),
        )
        _, mem = await r.admit(pod("mem2", 2))
        rec.figure(
            "allocate_mem_2gib", {"envs": mem.envs.get("main"), "mounts": mem.mounts.get("main")}
        )
        env, how = answer_env(s, mem, "main", 0)
        via = "driver" if modules_missing(["torch"]) else "torch"
        out = await asyncio.to_thread(run_child, s, env, f"{via}_limit", str(2 * GiB))
        got = figure(rec, "held_mem_2gib", out, via=via, answer=how)
        rec.check("node 2 GiB: the process sees 2 GiB", got.get("total") == 2 * GiB)
        rec.check(
            "node 2 GiB: the 2 GiB in one allocation", got.get("at_limit") in (0, "allocated")
        )
        rec.check(
            "node 2 GiB: one MiB more is out of memory", got.get("one_mib_more") in (OOM, "oom")
        )
    finally:
        await r.stop()

    r = NodeRig(s, source, Mode.CORE_MEM)
    await r.start()
    try:
        shown = await r.published()
        rec.figure("published_core_mem", shown)
        rec.check(
            "node: 100 gpu-core devices a GPU",
            shown["devices"].get(CORE, {}).get("count") == 100 * len(gpus),
        )
        _, core = await r.admit(pod("core30", 2, core=30))
        rec.figure(
            "allocate_core_30",
            {"envs": core.envs.get("main"), "mounts": core.mounts.get("main")},
        )
        if not s.rehearsal and (missing := modules_missing(["torch"])):
            rec.skip("held_core_30", missing)
            return
        env, how = answer_env(s, core, "main", 1)
        with NvmlSampler() as sampler:
            work = Workload(s, sampler)
            await asyncio.to_thread(work.baseline, rec)
            (shares,) = await asyncio.to_thread(work.run, [env])
        each = summary(shares, 30, work.window, work.nvml[0])
        rec.figure(
            "held_core_30",
            {"process": each, "seconds": work.seconds, "sm_clock_mhz": work.clock, "answer": how},
        )
        rec.check("node 30 %: within 5 points", held([each]))
    finally:
        await r.stop()
