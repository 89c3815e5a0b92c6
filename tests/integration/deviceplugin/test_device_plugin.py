"""The device plugin against a fake kubelet on temporary unix sockets, with the real extender."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import random
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpushare.core.model.inventory import Mode
from gpushare.core.model.names import ANN_ALLOCATION, ANN_ASSIGNED
from gpushare.core.model.startuptaint import STARTUP_TAINT
from gpushare.core.model.units import MemoryUnit
from gpushare.deviceplugin.config import PluginConfig
from gpushare.deviceplugin.plugin import DevicePlugin
from gpushare.kube.memory import MemoryKube
from gpushare.kube.port import Unreachable
from gpushare.node.enforcement.hook import NoIsolation
from gpushare.node.gpus import FakeGpus
from gpushare.node.preflight import StartRefused, refuse_static_cpu_policy
from tests.support import grpc_loop
from tests.support.pluginrig import CORE, MEM, NODE, Rig, bare_node, pod, run, served


def test_registers_advertises_and_publishes_the_node() -> None:
    async def body(r: Rig) -> None:
        assert r.kubelet.registrations == {MEM: "gpushare-mem.sock"}
        devices = await r.kubelet.wait_devices(MEM, 30)
        assert all(h == "Healthy" for h in devices.values())
        node = await r.kube.get_node(NODE)
        annotations = node["metadata"]["annotations"]
        inventory = json.loads(annotations["gpushare.io/gpus"])
        assert [(g["index"], g["memUnits"], g["uuid"]) for g in inventory] == [
            (0, 15, f"GPU-fake-{NODE}-0"),
            (1, 15, f"GPU-fake-{NODE}-1"),
        ]
        assert annotations["gpushare.io/gpu-mem-unit"] == "1GiB"
        assert annotations["gpushare.io/handoff"] == "podresources"
        assert node["status"]["capacity"]["aliyun.com/gpu-count"] == "2"
        # ACK's GPU node labels, from the fake backend's model name ("Fake GPU")
        labels = node["metadata"]["labels"]
        assert labels["aliyun.accelerator/nvidia_name"] == "Fake-GPU"
        assert labels["aliyun.accelerator/nvidia_count"] == "2"
        assert labels["aliyun.accelerator/nvidia_mem"] == "15360MiB"

    run(body)


def test_core_mem_nodes_serve_computing_power_one_device_per_percent() -> None:
    """kubelet asks for as many devices as the limit says (30 %: 30), as ACK counts (100/GPU)."""

    async def body(r: Rig) -> None:
        assert r.kubelet.registrations == {MEM: "gpushare-mem.sock", CORE: "gpushare-core.sock"}
        await r.kubelet.wait_devices(MEM, 30)
        for _ in range(100):
            if r.kubelet.devices.get(CORE):
                break
            await asyncio.sleep(0.05)
        placed = await r.place(pod("cuda-sample", 2, core=30))
        assert placed is not None
        admitted = await r.kubelet.admit(placed)
        envs = admitted.envs["c0"]
        assert envs["ALIYUN_COM_GPU_CORE_PERCENTAGE"] == "30"
        assert envs["ALIYUN_COM_GPU_MEM_CONTAINER"] == "2"
        assert len(admitted.containers["c0"][CORE]) == 30
        assert len(r.kubelet.devices[CORE]) == 200  # capacity "400" on the seed's 4-GPU node

    run(body, mode=Mode.CORE_MEM)


def test_seed_pod_gets_its_gpu_and_is_marked_served() -> None:
    async def body(r: Rig) -> None:
        await r.kubelet.wait_devices(MEM, 30)
        placed = await r.place(pod("gpu-share-sample", 3))
        assert placed is not None
        record = json.loads(placed["metadata"]["annotations"][ANN_ALLOCATION])
        index = record["gpus"][0]["index"]
        admitted = await r.kubelet.admit(placed)
        envs = admitted.envs["c0"]
        assert envs["NVIDIA_VISIBLE_DEVICES"] == f"GPU-fake-{NODE}-{index}"
        assert envs["ALIYUN_COM_GPU_MEM_IDX"] == str(index)
        assert (
            envs["ALIYUN_COM_GPU_MEM_POD"],
            envs["ALIYUN_COM_GPU_MEM_CONTAINER"],
            envs["ALIYUN_COM_GPU_MEM_DEV"],
        ) == ("3", "3", "15")
        for _ in range(100):
            stored = await r.kube.get_pod("default", "gpu-share-sample")
            if stored["metadata"]["annotations"][ANN_ASSIGNED] == "true":
                break
            await asyncio.sleep(0.05)
        assert stored["metadata"]["annotations"][ANN_ASSIGNED] == "true"
        assert r.plugin.stats.mismatches == 0 and r.plugin.stats.served_pods == 1

    run(body)


@pytest.mark.parametrize("outage", ["dropped", "expired"])
def test_a_pod_admitted_while_the_plugins_watch_lists_again_is_still_marked_served(
    outage: str,
) -> None:
    """The plugin's watch of its node's pods ends (a dropped connection, or 410 Gone) just
    before kubelet admits a pod: the watch lists again and the pod is marked served."""

    async def body(r: Rig) -> None:
        await r.kubelet.wait_devices(MEM, 30)
        lists = r.plugin.watch.lists
        placed = await r.place(pod("across", 2))
        assert placed is not None
        if outage == "dropped":
            r.kube.break_watches(Unreachable("connection reset by peer"))
        else:
            r.kube.expire_watches()
        await r.kubelet.admit(placed)
        assert await served(r, "across")
        assert r.plugin.watch.lists > lists
        assert r.plugin.stats.mismatches == 0 and r.plugin.stats.served_pods == 1

    run(body)


def test_a_pod_whose_init_container_asks_for_memory_is_served_and_marked() -> None:
    """kubelet lists no ordinary init container, and its app container reuses the init's IDs."""

    async def body(r: Rig) -> None:
        await r.kubelet.wait_devices(MEM, 30)
        placed = await r.place(pod("loader", 2, init=4))
        assert placed is not None
        admitted = await r.kubelet.admit(placed)
        assert set(admitted.containers["c0"][MEM]) < set(admitted.containers["init"][MEM])
        assert admitted.envs["init"]["ALIYUN_COM_GPU_MEM_CONTAINER"] == "4"
        assert admitted.envs["c0"]["ALIYUN_COM_GPU_MEM_CONTAINER"] == "2"
        assert admitted.envs["c0"]["ALIYUN_COM_GPU_MEM_POD"] == "4"
        assert await served(r, "loader")
        assert r.plugin.stats.mismatches == 0 and r.plugin.stats.served_pods == 1

    run(body)


def test_a_sidecar_asking_for_memory_is_listed_and_waited_for() -> None:
    async def body(r: Rig) -> None:
        await r.kubelet.wait_devices(MEM, 30)
        placed = await r.place(pod("with-sidecar", 2, init=3, sidecar=1))
        assert placed is not None
        admitted = await r.kubelet.admit(placed)
        assert admitted.listed == ["sidecar", "c0"]
        assert admitted.envs["sidecar"]["ALIYUN_COM_GPU_MEM_CONTAINER"] == "1"
        assert await served(r, "with-sidecar")
        assert r.plugin.stats.mismatches == 0

    run(body)


def test_a_pod_re_created_under_the_same_name_is_marked_served_again() -> None:
    """A StatefulSet re-creates web-0 with a new UID; PodResources names only web-0."""

    async def body(r: Rig) -> None:
        await r.kubelet.wait_devices(MEM, 30)
        uids = []
        for _ in range(2):
            placed = await r.place(pod("web-0", 3))
            assert placed is not None
            uids.append(placed["metadata"]["uid"])
            await r.kubelet.admit(placed)
            assert await served(r, "web-0")
            r.kube.delete_pod("default", "web-0")
            r.kubelet.forget("default", "web-0")
            await r.settle()
        assert uids[0] != uids[1]
        assert r.plugin.stats.served_pods == 2

    run(body)


def test_multi_container_and_multi_gpu_pods_get_all_their_gpus() -> None:
    async def body(r: Rig) -> None:
        await r.kubelet.wait_devices(MEM, 45)
        placed = await r.place(pod("trainer", 4, 2, gpu_count=2, init=6))
        assert placed is not None
        admitted = await r.kubelet.admit(placed)
        record = json.loads(placed["metadata"]["annotations"][ANN_ALLOCATION])
        for container in record["containers"]:
            name = "init" if container["kind"] == "init" else container["name"]
            envs = admitted.envs[name]
            layout = ",".join(f"{g['index']}:{g['mem']}" for g in container["gpus"] if g["mem"])
            assert envs["GPUSHARE_MEM_PER_GPU"] == layout
            assert len(envs["NVIDIA_VISIBLE_DEVICES"].split(",")) == 2

    run(body, gpus="3x15GiB")


@pytest.mark.parametrize("another_waits", [False, True])
def test_equal_containers_that_do_not_divide_over_the_gpus_are_placed_and_served(
    another_waits: bool,
) -> None:
    """gpu-count 2, two containers of 3 units: one layout for both, or Allocate cannot tell."""

    async def body(r: Rig) -> None:
        await r.kubelet.wait_devices(MEM, 30)
        if another_waits:  # a pod of another size, bound and not yet started
            assert await r.place(pod("first", 5)) is not None
        placed = await r.place(pod("twins", 3, 3, gpu_count=2))
        assert placed is not None, "the extender refused the pod"
        admitted = await r.kubelet.admit(placed)
        record = json.loads(placed["metadata"]["annotations"][ANN_ALLOCATION])
        first, second = (c["gpus"] for c in record["containers"])
        assert first == second
        assert sorted(g["mem"] for g in record["gpus"]) == [2, 4]
        layout = ",".join(f"{g['index']}:{g['mem']}" for g in first if g["mem"])
        assert admitted.envs["c0"]["GPUSHARE_MEM_PER_GPU"] == layout
        assert admitted.envs["c1"]["GPUSHARE_MEM_PER_GPU"] == layout
        assert await served(r, "twins")
        assert r.plugin.stats.mismatches == 0

    run(body)


class PruneRecorder(NoIsolation):
    """Keeps what the served-check tells the hook is still in use."""

    def __init__(self) -> None:
        self.live_devices: frozenset[tuple[str, ...]] = frozenset()

    def prune(self, live_uids: frozenset[str], live_devices: frozenset[tuple[str, ...]]) -> None:
        self.live_devices = live_devices


def test_the_served_check_reads_each_containers_whole_device_set() -> None:
    """kubelet lists one entry per device ID; a container's set is their union."""
    recorder = PruneRecorder()

    async def body(r: Rig) -> None:
        await r.kubelet.wait_devices(MEM, 30)
        placed = await r.place(pod("four", 4))
        assert placed is not None
        admitted = await r.kubelet.admit(placed)
        assert await served(r, "four")
        assert tuple(sorted(admitted.containers["c0"][MEM])) in recorder.live_devices
        assert r.plugin.served_signature(admitted.containers["c0"][MEM]) is not None

    run(body, hook=lambda root, gpus: recorder)


def test_a_pod_gpushare_did_not_place_gets_a_clear_error() -> None:
    async def body(r: Rig) -> None:
        await r.kubelet.wait_devices(MEM, 30)
        stray = r.kube.create_pod(pod("stray", 2))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await r.kubelet.admit(stray)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "no pod bound to this node is waiting for 2 mem device(s)" in str(
            err.value.details()
        )
        assert r.plugin.stats.refused == 1

    run(body)


def test_kubelet_restart_leads_to_re_registration() -> None:
    async def body(r: Rig) -> None:
        await r.kubelet.wait_devices(MEM, 30)
        before = r.kubelet.register_count
        await r.kubelet.restart()
        for _ in range(100):
            if r.kubelet.registrations.get(MEM):
                break
            await asyncio.sleep(0.05)
        assert r.kubelet.register_count == before + 1
        assert len(await r.kubelet.wait_devices(MEM, 30)) == 30

    run(body)


def test_unhealthy_gpu_is_withdrawn_and_avoided() -> None:
    async def body(r: Rig) -> None:
        await r.kubelet.wait_devices(MEM, 30, healthy=30)
        r.gpus.set_health(0, False)
        await r.kubelet.wait_devices(MEM, 30, healthy=15)
        for _ in range(100):
            await r.settle()
            node = r.cache.state.nodes.get(NODE)
            if node is not None and not node.gpus[0].healthy:
                break
            await asyncio.sleep(0.02)
        placed = await r.place(pod("after-xid", 1))
        assert placed is not None
        assert (
            json.loads(placed["metadata"]["annotations"][ANN_ALLOCATION])["gpus"][0]["index"] == 1
        )
        r.gpus.set_health(1, False)
        await r.kubelet.wait_devices(MEM, 30, healthy=0)
        await asyncio.sleep(0.1)
        await r.settle()
        assert await r.place(pod("nowhere", 1)) is None

    run(body)


def test_plugin_restart_loses_nothing() -> None:
    async def body(r: Rig) -> None:
        await r.kubelet.wait_devices(MEM, 30)
        placed = await r.place(pod("before-restart", 5))
        assert placed is not None
        await r.plugin.stop()
        # kubelet admits the pod while the plugin is down? No: it admits, then the plugin dies
        plugin = r.new_plugin()
        await plugin.start()
        r.plugin = plugin
        await r.kubelet.wait_devices(MEM, 30)
        await r.kubelet.admit(placed)
        await plugin.stop()
        gc.collect()
        again = r.new_plugin()  # reads the checkpoint of what was served
        await again.start()
        r.plugin = again
        for _ in range(100):
            stored = await r.kube.get_pod("default", "before-restart")
            if stored["metadata"]["annotations"][ANN_ASSIGNED] == "true":
                break
            await asyncio.sleep(0.05)
        assert stored["metadata"]["annotations"][ANN_ASSIGNED] == "true"
        assert again.stats.mismatches == 0
        assert (
            again.served_signature(
                r.kubelet.admitted[("default", "before-restart")].containers["c0"][MEM]
            )
            is not None
        )

    run(body)


INTERLEAVINGS = 60


def test_random_interleavings_over_grpc_never_serve_the_wrong_gpu() -> None:
    """Pods bound in one order, admitted by kubelet in another: every container checks out."""

    async def body(r: Rig) -> tuple[int, int]:
        await r.kubelet.wait_devices(MEM, 45)
        rng = random.Random(7)
        checked = mismatched = 0
        serial = 0
        for _ in range(INTERLEAVINGS):
            waiting: list[dict[str, Any]] = []
            for _ in range(rng.randint(3, 8)):
                serial += 1
                sizes = [rng.choice([1, 2, 2, 3]) for _ in range(rng.choice([1, 1, 2]))]
                placed = await r.place(pod(f"p{serial}", *sizes))
                if placed is not None:
                    waiting.append(placed)
                if waiting and rng.random() < 0.4:
                    chosen = waiting.pop(rng.randrange(len(waiting)))
                    checked, mismatched = await admit_and_check(r, chosen, checked, mismatched)
            rng.shuffle(waiting)
            for chosen in waiting:
                checked, mismatched = await admit_and_check(r, chosen, checked, mismatched)
            for key in list(r.kubelet.admitted):  # the pods finish; the GPUs empty out
                r.kube.delete_pod(*key)
                r.kubelet.forget(*key)
            await r.settle()
        return checked, mismatched

    checked, mismatched = run(body, gpus="3x15GiB")
    print(
        f"{INTERLEAVINGS} interleavings over gRPC: {checked} containers checked, "
        f"{mismatched} mismatches"
    )
    assert checked > 100 and mismatched == 0


async def admit_and_check(
    r: Rig, placed: dict[str, Any], checked: int, mismatched: int
) -> tuple[int, int]:
    admitted = await r.kubelet.admit(placed)
    record = json.loads(placed["metadata"]["annotations"][ANN_ALLOCATION])
    for container in record["containers"]:
        layout = ",".join(f"{g['index']}:{g['mem']}" for g in container["gpus"] if g["mem"])
        checked += 1
        if admitted.envs[container["name"]]["GPUSHARE_MEM_PER_GPU"] != layout:
            mismatched += 1
    return checked, mismatched


def test_static_cpu_manager_policy_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("kind: KubeletConfiguration\ncpuManagerPolicy: static\n")
    reason = refuse_static_cpu_policy(config, tmp_path / "missing")
    assert "cpuManagerPolicy: static" in reason and "set cpuManagerPolicy: none" in reason
    state = tmp_path / "cpu_manager_state"
    state.write_text('{"policyName":"none","defaultCpuSet":""}')
    assert refuse_static_cpu_policy(tmp_path / "missing", state) is None


def test_a_node_labelled_with_a_mode_gpushare_does_not_share_is_refused(tmp_path: Path) -> None:
    kube = MemoryKube()
    kube.put_node(bare_node("exclusive"))
    source = FakeGpus.parse("1x15GiB", node=NODE)
    config = PluginConfig(node=NODE, plugin_dir=tmp_path / "dp", state_dir=tmp_path / "state")
    plugin = DevicePlugin(api=kube, source=source, config=config)
    with pytest.raises(StartRefused) as refused:
        grpc_loop.run(plugin.start())
    assert "ack.node.gpu.schedule='exclusive'" in str(refused.value)
    node = grpc_loop.run(kube.get_node(NODE))
    assert "gpushare.io/gpus" not in node["metadata"].get("annotations", {})  # nothing published


def test_changing_the_unit_while_pods_hold_memory_is_refused() -> None:
    async def body(r: Rig) -> None:
        await r.kubelet.wait_devices(MEM, 30)
        placed = await r.place(pod("holder", 3))
        assert placed is not None
        await r.plugin.stop()
        config = dataclasses.replace(r.plugin.config, unit=MemoryUnit.MiB128)
        changed = DevicePlugin(api=r.kube, source=r.gpus, config=config)
        with pytest.raises(StartRefused) as refused:
            await changed.start()
        assert "default/holder" in str(refused.value) and "128MiB" in str(refused.value)
        node = await r.kube.get_node(NODE)
        assert node["metadata"]["annotations"]["gpushare.io/gpu-mem-unit"] == "1GiB"
        r.kube.delete_pod("default", "holder")
        await changed.start()  # nobody holds memory any more: the new unit is published
        r.plugin = changed
        node = await r.kube.get_node(NODE)
        assert node["metadata"]["annotations"]["gpushare.io/gpu-mem-unit"] == "128MiB"

    run(body)


def test_a_node_born_with_the_startup_taint_loses_it_once_kubelet_allocates_gpu_memory() -> None:
    """The plugin keeps the taint while kubelet shows no gpu-mem, then removes it and nothing
    else (core.model.startuptaint; docs/device-plugin.md, "Autoscaled pools")."""
    ours = {"key": STARTUP_TAINT, "effect": "NoSchedule"}
    other = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}

    async def body(r: Rig) -> None:
        await r.plugin.stop()
        node = await r.kube.get_node(NODE)
        node["spec"] = {"taints": [other, ours]}
        r.kube.put_node(node)
        r.plugin = r.new_plugin()
        await r.plugin.start()
        await asyncio.sleep(0.5)
        assert (await r.kube.get_node(NODE))["spec"]["taints"] == [other, ours]
        await r.kube.patch_node(NODE, capacity={MEM: "30"})  # kubelet took the registration
        for _ in range(100):
            if (await r.kube.get_node(NODE))["spec"]["taints"] == [other]:
                break
            await asyncio.sleep(0.05)
        assert (await r.kube.get_node(NODE))["spec"]["taints"] == [other]
        assert r.plugin.not_ready() == ""  # the finished removal is no stopped watcher

    run(body)
