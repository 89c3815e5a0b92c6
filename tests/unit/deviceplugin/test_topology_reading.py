"""Where a node's topology comes from: NVML (a stand-in module), the fake backend's flag, and
the device plugin writing it on the node only when it changes."""

from __future__ import annotations

import asyncio
import sys
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from gpushare.core.model.inventory import read_node
from gpushare.core.model.names import ANN_NODE_GPUS, ANN_NODE_TOPOLOGY
from gpushare.core.model.topology import (
    LAYOUTS,
    check_distance,
    islands,
    layout,
    topology_annotation,
)
from gpushare.deviceplugin.config import PluginConfig
from gpushare.deviceplugin.plugin import DevicePlugin
from gpushare.kube.memory import MemoryKube
from gpushare.node.gpus import FakeGpus, NvmlGpus
from gpushare.node.interconnect import bus_id, read_interconnect
from gpushare.node.publishing import publish, topology_change

# -- a stand-in for pynvml ---------------------------------------------------------------------


class NVMLError(Exception):
    """pynvml's error class (the code is all a caller sees)."""


@dataclass
class Pci:
    busId: str  # pynvml's field name


@dataclass
class Box:
    """A made-up machine: bus IDs, PCIe levels per pair, and NVLink links per GPU.

    ``links[i]`` lists, per active link of GPU i, the bus ID at its far end; ``"switch"`` is an
    NVSwitch. GPUs without an entry have no NVLink (NVML answers NOT_SUPPORTED).
    """

    buses: list[str]
    levels: dict[tuple[int, int], int]
    links: dict[int, list[str]]
    max_links: int = 18
    broken_pair: tuple[int, int] | None = None

    def module(self) -> types.ModuleType:
        nvml = types.ModuleType("pynvml")
        box = self
        nvml.NVMLError = NVMLError  # type: ignore[attr-defined]
        nvml.NVML_NVLINK_MAX_LINKS = self.max_links  # type: ignore[attr-defined]
        nvml.NVML_FEATURE_ENABLED = 1  # type: ignore[attr-defined]
        nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH = 2  # type: ignore[attr-defined]
        switch_bus = "00000000:c0:00.0"

        def state(handle: int, link: int) -> int:
            if handle not in box.links or link >= box.max_links:
                raise NVMLError("Not Supported")
            return 1 if link < len(box.links[handle]) else 0

        def remote(handle: int, link: int) -> Pci:
            far = box.links[handle][link]
            return Pci(switch_bus if far == "switch" else far)

        def remote_type(handle: int, link: int) -> int:
            return 2 if box.links[handle][link] == "switch" else 0

        def ancestor(a: int, b: int) -> int:
            if box.broken_pair == (min(a, b), max(a, b)):
                raise NVMLError("Unknown Error")
            return box.levels[(min(a, b), max(a, b))]

        nvml.nvmlDeviceGetNvLinkState = state  # type: ignore[attr-defined]
        nvml.nvmlDeviceGetNvLinkRemotePciInfo = remote  # type: ignore[attr-defined]
        nvml.nvmlDeviceGetNvLinkRemoteDeviceType = remote_type  # type: ignore[attr-defined]
        nvml.nvmlDeviceGetTopologyCommonAncestor = ancestor  # type: ignore[attr-defined]
        nvml.nvmlDeviceGetPciInfo = lambda handle: Pci(box.buses[handle])  # type: ignore[attr-defined]
        return nvml


BUSES = ["00000000:07:00.0", "00000000:0B:00.0", "00000000:48:00.0", "00000000:4C:00.0"]


def two_bridged_pairs() -> Box:
    """Two NVLink-bridged pairs, each pair under one PCIe switch, the pairs across sockets;
    the far ends spelt the short way (domain 0000), as the remote info may spell them."""
    short = ["0000:07:00.0", "0000:0b:00.0", "0000:48:00.0", "0000:4c:00.0"]
    return Box(
        buses=BUSES,
        levels={(0, 1): 10, (2, 3): 10, (0, 2): 50, (0, 3): 50, (1, 2): 50, (1, 3): 50},
        links={0: [short[1]] * 4, 1: [short[0]] * 4, 2: [short[3]] * 4, 3: [short[2]] * 4},
    )


def test_bus_ids_compare_by_number_whatever_the_domain_width() -> None:
    assert bus_id(Pci("00000000:0B:00.0")) == bus_id("0000:0b:00.0") == bus_id(b"0b:00.0")
    assert bus_id("00000001:0b:00.0") != bus_id("0000:0b:00.0")


def test_nvlink_pairs_and_pcie_levels_become_the_distance_matrix() -> None:
    box = two_bridged_pairs()
    found = read_interconnect(box.module(), [0, 1, 2, 3])
    assert not found.problem
    assert found.distance == ((0, 1, 6, 6), (1, 0, 6, 6), (6, 6, 0, 1), (6, 6, 1, 0))
    assert found.links == {(0, 1): 4, (2, 3): 4}  # each link counted once, not from both ends


def test_without_nvlink_each_pcie_level_has_its_distance() -> None:
    # NVML_TOPOLOGY_INTERNAL, SINGLE, MULTIPLE, HOSTBRIDGE, NODE, SYSTEM and one NVML may add
    levels = [0, 10, 20, 30, 40, 50, 60]
    want = [2, 2, 3, 4, 5, 6, 6]
    for level, distance in zip(levels, want, strict=True):
        box = Box(buses=BUSES[:2], levels={(0, 1): level}, links={})
        assert read_interconnect(box.module(), [0, 1]).distance == ((0, distance), (distance, 0))


def test_an_nvswitch_box_is_all_nvlink() -> None:
    box = Box(
        buses=BUSES,
        levels=dict.fromkeys([(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)], 50),
        links={i: ["switch"] * 12 for i in range(4)},
    )
    found = read_interconnect(box.module(), [0, 1, 2, 3])
    assert found.distance == islands(4, 4)
    assert found.links[(0, 3)] == 12


def test_links_past_the_last_and_inactive_ones_are_no_link() -> None:
    box = two_bridged_pairs()
    box.links[2] = [BUSES[3], BUSES[3]]  # GPU 2: two active links, then inactive ones
    box.max_links = 3
    found = read_interconnect(box.module(), [0, 1, 2, 3])
    assert found.links == {(0, 1): 3, (2, 3): 2}


def test_a_pair_nvml_cannot_place_means_no_topology_and_says_which() -> None:
    box = two_bridged_pairs()
    box.links = {}
    box.broken_pair = (1, 2)
    found = read_interconnect(box.module(), [0, 1, 2, 3])
    assert found.distance == ()
    assert "nvmlDeviceGetTopologyCommonAncestor(GPU 1, GPU 2) failed" in found.problem


def test_one_gpu_has_no_topology() -> None:
    assert read_interconnect(two_bridged_pairs().module(), [0]).distance == ()


def test_the_nvml_backend_reads_the_topology_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    box = two_bridged_pairs()
    nvml = box.module()
    memory = types.SimpleNamespace(total=16 * 1024**3)
    for name, value in {
        "nvmlInit": lambda: None,
        "nvmlDeviceGetCount": lambda: 4,
        "nvmlDeviceGetHandleByIndex": lambda index: index,
        "nvmlDeviceGetUUID": lambda handle: f"GPU-{handle}".encode(),
        "nvmlDeviceGetName": lambda handle: b"Tesla V100-SXM2-16GB",
        "nvmlDeviceGetMinorNumber": lambda handle: handle,
        "nvmlDeviceGetMemoryInfo": lambda handle: memory,
        "nvmlEventSetCreate": lambda: (_ for _ in ()).throw(NVMLError("Not Supported")),
    }.items():
        setattr(nvml, name, value)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    source = NvmlGpus()
    assert source.topology() == ((0, 1, 6, 6), (1, 0, 6, 6), (6, 6, 0, 1), (6, 6, 1, 0))
    assert [g.uuid for g in source.gpus()] == ["GPU-0", "GPU-1", "GPU-2", "GPU-3"]
    assert [g.minor for g in source.gpus()] == [0, 1, 2, 3]  # the driver-root hand-off's


# -- layouts for made-up nodes -----------------------------------------------------------------


def test_layouts_by_name() -> None:
    assert layout("nvswitch", 4) == (islands(4, 4), "")
    assert layout("nvlink-pairs", 4)[0] == ((0, 1, 6, 6), (1, 0, 6, 6), (6, 6, 0, 1), (6, 6, 1, 0))
    eight = layout("nvlink-islands", 8)[0]
    assert eight[0][3] == 1 and eight[3][4] == 6 and eight[4][7] == 1
    assert layout("pcie", 2)[0] == ((0, 4), (4, 0))
    for name in LAYOUTS:
        distance, problem = layout(name, 8)
        assert not problem and check_distance(distance, 8) == (distance, "")


def test_an_explicit_matrix() -> None:
    assert layout("0,1,5; 1,0,5; 5,5,0", 3) == (((0, 1, 5), (1, 0, 5), (5, 5, 0)), "")


@pytest.mark.parametrize(
    ("spec", "gpus", "says"),
    [
        ("star", 4, "'star' is neither a layout (nvswitch, nvlink-pairs"),
        ("nvlink-pairs", 3, "'nvlink-pairs' needs an even number of GPUs, not 3"),
        ("0,1;1,0", 3, "distance has 2 rows for 3 GPUs"),
        ("0,1;2,0", 2, "distance[1][0]=2 but distance[0][1]=1"),
        ("0,7;7,0", 2, "distance[0][1]=7"),
        ("1,1;1,0", 2, "distance[0][0]=1"),
        ("0,1;1", 2, "distance[1] has 1 entries"),
        ("", 2, "is empty"),
    ],
)
def test_a_bad_layout_names_the_value_and_the_rule(spec: str, gpus: int, says: str) -> None:
    distance, problem = layout(spec, gpus)
    assert distance == () and says in problem
    if "rows" in says or "distance[" in says:
        assert f"a symmetric {gpus}x{gpus} matrix of integers 1..6" in problem


def test_the_fake_backend_takes_a_topology_and_names_the_flag_when_it_is_wrong() -> None:
    fake = FakeGpus.parse("4x15GiB", topology="nvlink-pairs")
    assert fake.topology()[0] == (0, 1, 6, 6)
    assert FakeGpus.parse("4x15GiB").topology() == ()
    with pytest.raises(ValueError, match=r"--fake-topology '0,1;1,0': distance has 2 rows") as err:
        FakeGpus.parse("4x15GiB", topology="0,1;1,0")
    assert "--fake-gpus 4x15GiB, 4 GPUs" in str(err.value)


# -- writing it on the node --------------------------------------------------------------------


class Recording(MemoryKube):
    """Records the annotations of every node patch."""

    def __init__(self) -> None:
        super().__init__()
        self.patched: list[dict[str, str | None]] = []

    async def patch_node(
        self,
        name: str,
        *,
        annotations: Mapping[str, str | None] | None = None,
        capacity: Mapping[str, str] | None = None,
        labels: Mapping[str, str | None] | None = None,
    ) -> None:
        self.patched.append(dict(annotations or {}))
        await super().patch_node(name, annotations=annotations, capacity=capacity, labels=labels)


def node_object(name: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"ack.node.gpu.schedule": "share"},
            "annotations": annotations or {},
        },
        "status": {"capacity": {}, "allocatable": {}},
    }


def test_topology_change_writes_only_a_difference() -> None:
    pairs = layout("nvlink-pairs", 4)[0]
    text = topology_annotation(pairs)
    assert topology_change(None, pairs) == {ANN_NODE_TOPOLOGY: text}
    assert topology_change(text, pairs) == {}
    assert topology_change(text, ()) == {ANN_NODE_TOPOLOGY: None}  # a stale one is removed
    assert topology_change(None, ()) == {}


def test_the_plugin_publishes_the_topology_once_and_the_scheduler_reads_it(
    tmp_path: Any,
) -> None:
    kube = Recording()
    kube.put_node(node_object("n1"))
    fake = FakeGpus.parse("4x15GiB", node="n1", topology="nvlink-pairs")
    plugin = DevicePlugin(api=kube, source=fake, config=PluginConfig(node="n1", state_dir=tmp_path))

    async def start_and_fail_a_gpu() -> None:
        node = await kube.get_node("n1")
        plugin._topology_on_node = node["metadata"]["annotations"].get(ANN_NODE_TOPOLOGY)
        await plugin.publish()
        fake.set_health(1, False)
        await plugin.publish()  # what a health change does

    asyncio.run(start_and_fail_a_gpu())
    assert [ANN_NODE_TOPOLOGY in p for p in kube.patched] == [True, False]
    assert [ANN_NODE_GPUS in p for p in kube.patched] == [True, True]
    inventory = read_node(asyncio.run(kube.get_node("n1")))
    assert inventory.distance == fake.topology() and not inventory.topology_problem


def test_a_restarted_plugin_leaves_an_equal_topology_and_removes_a_stale_one() -> None:
    pairs = layout("nvlink-pairs", 4)[0]
    kube = Recording()
    kube.put_node(node_object("n1", {ANN_NODE_TOPOLOGY: topology_annotation(pairs)}))
    config = PluginConfig(node="n1")
    same = FakeGpus.parse("4x15GiB", topology="nvlink-pairs")
    held = asyncio.run(publish(kube, same, config, topology_on_node=topology_annotation(pairs)))
    assert held == topology_annotation(pairs) and ANN_NODE_TOPOLOGY not in kube.patched[-1]
    none = FakeGpus.parse("4x15GiB")
    assert asyncio.run(publish(kube, none, config, topology_on_node=held)) is None
    assert kube.patched[-1][ANN_NODE_TOPOLOGY] is None
    node = asyncio.run(kube.get_node("n1"))
    assert ANN_NODE_TOPOLOGY not in node["metadata"]["annotations"]
