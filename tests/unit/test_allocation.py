"""Allocations: splitting over GPUs and the annotation round trip."""

from __future__ import annotations

from gpushare.core.allocation import from_pod, plan, to_annotations
from gpushare.core.requests import ContainerKind, ContainerRequest, PodRequest
from gpushare.core.units import MemoryUnit


def request(
    *containers: ContainerRequest, gpu_count: int = 1, mem: int, core: int = 0
) -> PodRequest:
    return PodRequest(
        namespace="ns",
        name="p",
        uid="u1",
        containers=containers,
        gpu_count=gpu_count,
        mem_units=mem,
        core_pct=core,
    )


def test_two_containers_over_two_gpus_give_each_gpu_its_half() -> None:
    req = request(
        ContainerRequest("a", ContainerKind.APP, 3),
        ContainerRequest("b", ContainerKind.APP, 3),
        gpu_count=2,
        mem=6,
    )
    allocation = plan(req, node="n", indexes=[1, 3], unit=MemoryUnit.GiB)
    assert [(s.index, s.mem_units) for s in allocation.gpus] == [(1, 3), (3, 3)]
    per_gpu = {1: 0, 3: 0}
    for container in allocation.containers:
        for share in container.gpus:
            per_gpu[share.index] += share.mem_units
    assert per_gpu == {1: 3, 3: 3}
    assert [c.mem_units for c in allocation.containers] == [3, 3]


def test_init_container_gets_its_own_tape() -> None:
    req = request(
        ContainerRequest("i", ContainerKind.INIT, 4),
        ContainerRequest("a", ContainerKind.APP, 2),
        gpu_count=2,
        mem=4,
    )
    allocation = plan(req, node="n", indexes=[0, 1], unit=MemoryUnit.GiB)
    init, app = allocation.containers
    assert [s.mem_units for s in init.gpus] == [2, 2]
    assert [s.mem_units for s in app.gpus] == [1, 1]


def test_annotations_round_trip_and_predecessor_keys() -> None:
    req = request(ContainerRequest("c", ContainerKind.APP, 2, 30), mem=2, core=30)
    allocation = plan(req, node="n", indexes=[2], unit=MemoryUnit.GiB, assume_time_ns=42)
    annotations = to_annotations(allocation, dev_units=15)
    assert annotations["ALIYUN_COM_GPU_MEM_IDX"] == "2"
    assert annotations["ALIYUN_COM_GPU_MEM_POD"] == "2"
    assert annotations["ALIYUN_COM_GPU_MEM_DEV"] == "15"
    assert annotations["ALIYUN_COM_GPU_MEM_ASSIGNED"] == "false"
    assert annotations["ALIYUN_COM_GPU_MEM_ASSUME_TIME"] == "42"
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u1", "annotations": annotations}}
    assert from_pod(pod) == allocation


def test_predecessor_only_pods_are_read_from_its_keys() -> None:
    pod = {
        "metadata": {
            "name": "old",
            "uid": "u9",
            "annotations": {
                "ALIYUN_COM_GPU_MEM_IDX": "1",
                "ALIYUN_COM_GPU_MEM_POD": "4",
                "ALIYUN_COM_GPU_MEM_ASSIGNED": "true",
            },
        },
        "spec": {"nodeName": "n"},
    }
    allocation = from_pod(pod)
    assert allocation is not None
    assert (allocation.node, allocation.indexes, allocation.mem_units, allocation.assigned) == (
        "n",
        (1,),
        4,
        True,
    )


def test_unreadable_record_gives_none() -> None:
    pod = {"metadata": {"name": "p", "annotations": {"gpushare.io/allocation": "{oops"}}}
    assert from_pod(pod) is None
