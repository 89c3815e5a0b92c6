"""The device-list strategies through the plugin and a kubelet double: what a container is
handed, and the starts the plugin refuses (issue 39)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.core.model.inventory import Mode
from gpushare.deviceplugin.config import PluginConfig
from gpushare.deviceplugin.plugin import DevicePlugin
from gpushare.kube.memory import MemoryKube
from gpushare.node.cdi import VOID, HandOff, Strategy
from gpushare.node.driverroot import DriverRoot
from gpushare.node.gpus import FakeGpus
from gpushare.node.preflight import StartRefused
from tests.support import grpc_loop
from tests.support.fake_kubelet import FakeKubelet
from tests.support.pluginrig import CORE, MEM, NODE, Rig, bare_node, pod, run


def uuid(index: int) -> str:
    """The fake GPUs' UUIDs (FakeGpus)."""
    return f"GPU-fake-{NODE}-{index}"


def toolkit_spec(gpus: int, *, kind: str = "nvidia.com/gpu") -> dict[str, Any]:
    """A spec shaped as ``nvidia-ctk cdi generate`` writes one: devices by index, by UUID, all."""
    devices = []
    for i in range(gpus):
        edits = {"deviceNodes": [{"path": f"/dev/nvidia{i}"}]}
        devices += [
            {"name": str(i), "containerEdits": edits},
            {"name": uuid(i), "containerEdits": edits},
        ]
    devices.append({"name": "all", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}})
    return {"cdiVersion": "0.5.0", "kind": kind, "devices": devices, "containerEdits": {}}


def cdi(spec: dict[str, Any] | None, *, as_json: bool = False) -> Any:
    """A cdi-cri hand-off reading a spec directory under the rig's root."""

    def make(root: Path) -> HandOff:
        specs = root / "cdi"
        specs.mkdir()
        if spec is not None:
            name, text = (
                ("nvidia.json", json.dumps(spec)) if as_json else ("nvidia.yaml", yaml.dump(spec))
            )
            (specs / name).write_text(text)
        return HandOff(Strategy.CDI_CRI, spec_dirs=(specs, root / "missing"))

    return make


async def admit_one(r: Rig, manifest: dict[str, Any]) -> tuple[Any, int]:
    """Place and admit one pod through the kubelet double: what it was given, its GPU index."""
    placed = await r.place(manifest)
    assert placed is not None
    admitted = await r.kubelet.admit(placed)
    return admitted, int(admitted.envs["c0"]["ALIYUN_COM_GPU_MEM_IDX"])


@pytest.mark.parametrize("as_json", [False, True])
def test_cdi_cri_hands_over_the_placed_gpu_by_uuid_and_voids_the_variable(as_json: bool) -> None:
    async def body(r: Rig) -> None:
        await r.kubelet.wait_devices(MEM, 30)
        admitted, index = await admit_one(r, pod("one", 4))
        assert admitted.cdi_devices["c0"] == [f"nvidia.com/gpu={uuid(index)}"]
        assert admitted.envs["c0"]["NVIDIA_VISIBLE_DEVICES"] == VOID

    run(body, handoff=cdi(toolkit_spec(2), as_json=as_json))


def test_under_core_mem_the_gpu_is_named_once_though_two_resources_answer() -> None:
    async def body(r: Rig) -> None:
        await r.kubelet.wait_devices(CORE, 200)
        admitted, index = await admit_one(r, pod("both", 2, core=30))
        assert set(admitted.containers["c0"]) == {MEM, CORE}
        assert admitted.cdi_devices["c0"] == [f"nvidia.com/gpu={uuid(index)}"]

    run(body, mode=Mode.CORE_MEM, handoff=cdi(toolkit_spec(2)))


def test_envvar_hands_over_the_uuids_and_no_cdi_device() -> None:
    async def body(r: Rig) -> None:
        await r.kubelet.wait_devices(MEM, 30)
        admitted, index = await admit_one(r, pod("one", 4))
        assert admitted.envs["c0"]["NVIDIA_VISIBLE_DEVICES"] == uuid(index)
        assert admitted.cdi_devices["c0"] == []

    run(body)


def start(
    handoff: HandOff, node: dict[str, Any] | None = None, exclusive_cpus: tuple[int, ...] = ()
) -> DevicePlugin:
    """Start (and stop) a plugin on a fresh node beside a kubelet double."""

    async def main() -> DevicePlugin:
        root = handoff.spec_dirs[0].parent if handoff.spec_dirs else Path("/tmp")
        kube = MemoryKube()
        kube.put_node(node or bare_node(Mode.SHARE))
        kubelet = FakeKubelet(root / "dp", root / "podres.sock")
        kubelet.exclusive_cpus = exclusive_cpus
        await kubelet.start()
        plugin = DevicePlugin(
            api=kube,
            source=FakeGpus.parse("2x15GiB", node=NODE),
            config=PluginConfig(
                node=NODE,
                plugin_dir=root / "dp",
                pod_resources_socket=root / "podres.sock",
                state_dir=root / "state",
                handoff=handoff,
            ),
        )
        try:
            await plugin.start()
        finally:
            await plugin.stop()
            await kubelet.stop()
        return plugin

    return grpc_loop.run(main())


@pytest.mark.parametrize(
    ("spec", "expect"),
    [
        (None, "no spec file in"),
        (toolkit_spec(1), "name 3 device(s), not these"),  # GPU 1 is not in it
        (toolkit_spec(2, kind="example.com/gpu"), "declares kind nvidia.com/gpu"),
    ],
)
def test_cdi_cri_refuses_to_start_where_the_spec_does_not_name_every_gpu(
    tmp_path: Path, spec: dict[str, Any] | None, expect: str
) -> None:
    handoff = cdi(spec)(tmp_path)
    with pytest.raises(StartRefused) as refused:
        start(handoff)
    message = str(refused.value)
    assert expect in message
    assert uuid(1) in message
    assert "nvidia-ctk cdi generate" in message
    assert "devicePlugin.deviceListStrategy=envvar" in message


def test_a_spec_that_loses_a_gpu_refuses_its_allocation_with_the_reason() -> None:
    async def body(r: Rig) -> None:
        await r.kubelet.wait_devices(MEM, 30)
        handoff = r.plugin.config.handoff
        for spec in handoff.spec_dirs[0].iterdir():
            spec.write_text(yaml.dump(toolkit_spec(0)))  # the toolkit rewrote it: no GPU
        placed = await r.place(pod("one", 4))
        assert placed is not None
        with pytest.raises(Exception, match=r"no CDI device nvidia\.com/gpu=<uuid>"):
            await r.kubelet.admit(placed)

    run(body, handoff=cdi(toolkit_spec(2)))


def test_the_plugin_refuses_a_node_whose_gpus_another_plugin_hands_out(tmp_path: Path) -> None:
    node = bare_node(Mode.SHARE)
    node["status"]["allocatable"] = {"nvidia.com/gpu": "2", "cpu": "8"}
    with pytest.raises(StartRefused) as refused:
        start(HandOff(spec_dirs=(tmp_path / "none",)), node)
    message = str(refused.value)
    assert "already offers nvidia.com/gpu=2 from another device plugin" in message
    assert f"kubectl label node {NODE} --overwrite nvidia.com/gpu.deploy.device-plugin=false" in (
        message
    )


def test_a_resource_the_other_plugin_no_longer_offers_does_not_stop_the_start(
    tmp_path: Path,
) -> None:
    node = bare_node(Mode.SHARE)
    node["status"]["allocatable"] = {"nvidia.com/gpu": "0"}  # kubelet's after it went
    node["status"]["capacity"] = {"nvidia.com/gpu": "2"}
    start(HandOff(spec_dirs=(tmp_path / "none",)), node)


def test_kubelet_s_static_cpu_policy_is_seen_through_pod_resources(tmp_path: Path) -> None:
    """No kubelet file needed (EKS, GKE, k3s keep theirs elsewhere): CPUs offered for exclusive
    use are the static policy's."""
    with pytest.raises(StartRefused) as refused:
        start(HandOff(spec_dirs=(tmp_path / "none",)), exclusive_cpus=(2, 3))
    assert "kubelet runs the static CPU manager policy (PodResources offers 2 CPU(s)" in str(
        refused.value
    )
    start(HandOff(spec_dirs=(tmp_path / "none",)), exclusive_cpus=())


def driver_root(*, nodes: tuple[str, ...] = ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm")):
    """A driver-root hand-off: a driver directory and a device directory under the rig's root
    (plain files stand for the device nodes: the plugin only checks that they are there)."""

    def make(root: Path) -> HandOff:
        (root / "driver" / "lib64").mkdir(parents=True)
        (root / "dev").mkdir()
        for name in nodes:
            (root / "dev" / name).touch()
        found = DriverRoot(root / "driver", dev_root=root / "dev")
        return HandOff(Strategy.DRIVER_ROOT, spec_dirs=(root / "none",), driver_root=found)

    return make


def test_driver_root_hands_over_the_placed_gpu_s_node_the_shared_ones_and_the_driver() -> None:
    """GKE's plugin's contract (docs/driver-root.md): /dev/nvidia<minor> of the GPU, nvidiactl
    and nvidia-uvm (nvidia-uvm-tools only where the host has it), the driver directory read-only
    at /usr/local/nvidia; the variable voided, no CDI device."""

    async def body(r: Rig) -> None:
        await r.kubelet.wait_devices(MEM, 30)
        admitted, index = await admit_one(r, pod("one", 4))
        root = r.plugin.config.handoff.driver_root
        assert root is not None
        dev = root.dev_root
        assert admitted.devices["c0"] == [
            (f"/dev/nvidia{index}", f"{dev}/nvidia{index}", "mrw"),
            ("/dev/nvidiactl", f"{dev}/nvidiactl", "mrw"),
            ("/dev/nvidia-uvm", f"{dev}/nvidia-uvm", "mrw"),
        ]
        assert ("/usr/local/nvidia", str(root.host_path), True) in admitted.mounts["c0"]
        assert admitted.envs["c0"]["NVIDIA_VISIBLE_DEVICES"] == VOID
        assert admitted.cdi_devices["c0"] == []

    run(body, handoff=driver_root())


def test_under_driver_root_and_core_mem_the_nodes_are_answered_once() -> None:
    async def body(r: Rig) -> None:
        await r.kubelet.wait_devices(CORE, 200)
        admitted, index = await admit_one(r, pod("both", 2, core=30))
        assert set(admitted.containers["c0"]) == {MEM, CORE}
        paths = [c for c, _, _ in admitted.devices["c0"]]
        assert paths == [f"/dev/nvidia{index}", "/dev/nvidiactl", "/dev/nvidia-uvm"]

    run(body, mode=Mode.CORE_MEM, handoff=driver_root())


def test_driver_root_refuses_to_start_without_a_gpu_s_device_node(tmp_path: Path) -> None:
    handoff = driver_root(nodes=("nvidia0", "nvidiactl"))(tmp_path)
    with pytest.raises(StartRefused) as refused:
        start(handoff)
    message = str(refused.value)
    assert f"no device node for GPU(s) {uuid(1)} ({tmp_path}/dev/nvidia1)" in message
    assert "devicePlugin.driverRoot.devHostPath" in message
