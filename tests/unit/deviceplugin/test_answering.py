"""Allocate's answer as a pure function: the node's pods as read in, a container's answer out.

No gRPC, API client or files: the pods, their specs and the GPUs are plain values here, as the
device plugin's ``Allocator`` passes them after reading the node.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpushare.core.model.containers import ContainerKind
from gpushare.core.model.inventory import Mode
from gpushare.core.model.status import Status
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.allocation import Allocation, ContainerShare, GpuShare
from gpushare.core.records.handoff import MEM, Stranger
from gpushare.core.records.trust import NodePods
from gpushare.deviceplugin.answering import (
    Granted,
    NodeFacts,
    Request,
    answer,
    blocking_strangers,
)
from gpushare.node.cdi import HandOff, Strategy
from gpushare.node.gpus import GpuInfo

GPUS = (
    GpuInfo(index=0, uuid="GPU-a", model="T4", memory_mib=15 * 1024),
    GpuInfo(index=1, uuid="GPU-b", model="T4", memory_mib=15 * 1024),
)


def facts(mode: Mode = Mode.SHARE, handoff: HandOff | None = None) -> NodeFacts:
    return NodeFacts(
        gpus=GPUS, mode=mode, unit=MemoryUnit.GiB, handoff=handoff or HandOff(), max_pods=20
    )


def placed(name: str, index: int, mem: int, container: str = "main") -> Allocation:
    share = GpuShare(index=index, mem_units=mem)
    return Allocation(
        uid=f"uid-{name}",
        namespace="ns",
        name=name,
        node="n",
        unit=MemoryUnit.GiB,
        gpus=(share,),
        containers=(ContainerShare(name=container, kind=ContainerKind.APP, gpus=(share,)),),
    )


def spec(name: str, weight: str | None = None, container: str = "main") -> dict[str, Any]:
    env = [] if weight is None else [{"name": "ALIYUN_COM_GPU_SCHD_WEIGHT", "value": weight}]
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
        "spec": {"containers": [{"name": container, "env": env}]},
    }


def ids(count: int) -> tuple[str, ...]:
    return tuple(f"GPU-a-mem-{k}" for k in range(count))


def test_one_waiting_container_gets_its_gpu_and_share() -> None:
    pods = NodePods(allocations=(placed("p", index=1, mem=4),))
    got = answer(Request(MEM, ids(4)), pods, {}, facts())
    assert isinstance(got, Granted)
    assert got.uuids == ("GPU-b",)
    assert got.answer.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-b"
    assert got.answer.envs["ALIYUN_COM_GPU_MEM_IDX"] == "1"
    assert got.answer.envs["ALIYUN_COM_GPU_MEM_CONTAINER"] == "4"
    assert got.answer.envs["ALIYUN_COM_GPU_MEM_DEV"] == "15"
    assert got.answer.cdi_devices == ()
    assert got.target.device_ids == ids(4)
    assert [c.pod for c in got.target.candidates] == ["ns/p"]
    assert got.target.weight == 1 and got.notes == ()


def test_cdi_cri_names_the_devices_and_voids_the_variable() -> None:
    handoff = HandOff(strategy=Strategy.CDI_CRI, spec_dirs=(Path("/nonexistent"),))
    pods = NodePods(allocations=(placed("p", index=0, mem=2),))
    got = answer(Request(MEM, ids(2)), pods, {}, facts(handoff=handoff))
    assert isinstance(got, Granted)
    assert got.answer.cdi_devices == ("nvidia.com/gpu=GPU-a",)
    assert got.answer.envs["NVIDIA_VISIBLE_DEVICES"] == "void"


def test_nobody_waiting_for_the_count_is_refused_with_kubelets_text() -> None:
    pods = NodePods(allocations=(placed("p", index=0, mem=2),))
    got = answer(Request(MEM, ids(3)), pods, {}, facts())
    assert isinstance(got, Status) and got.attributed == (
        "gpushare: no pod bound to this node is waiting for 3 mem device(s); the pod being "
        "admitted was not placed by gpushare, or its annotations are missing"
    )


def test_a_stranger_of_the_count_blocks_the_placed_pod() -> None:
    stranger = Stranger("uid-s", "ns/s", "no allocation", frozenset({(MEM, 2)}))
    pods = NodePods(allocations=(placed("p", index=0, mem=2),), strangers=(stranger,))
    request = Request(MEM, ids(2))
    got = answer(request, pods, {}, facts())
    assert isinstance(got, Status) and "pod ns/s (no allocation)" in got.message
    assert blocking_strangers(request, pods) == {"uid-s"}
    alone = NodePods(strangers=(stranger,))  # nobody gpushare placed waits: no wait either
    assert blocking_strangers(request, alone) == frozenset()
    assert blocking_strangers(request, NodePods(allocations=pods.allocations)) == frozenset()


def test_candidates_asking_different_weights_get_the_lowest_with_notes() -> None:
    pods = NodePods(allocations=(placed("p", index=0, mem=2), placed("q", index=0, mem=2)))
    specs = {"uid-p": spec("p", "3"), "uid-q": spec("q", "nine")}
    got = answer(Request(MEM, ids(2)), pods, specs, facts(Mode.CGPU))
    assert isinstance(got, Granted)
    assert got.target.weight == 1
    assert len(got.notes) == 2
    assert got.notes[0].startswith("pod=ns/q phase=allocate cgpu weight: ")
    assert "weights [1, 3]; the lowest is given" in got.notes[1]
