"""Allocations: splitting over GPUs and the annotation round trip."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpushare.core.model.requests import (
    ContainerKind,
    ContainerRequest,
    PodRequest,
    counted,
    effective_amount,
)
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.allocation import Allocation, from_pod, plan, to_annotations


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


def layouts(allocation: Allocation) -> dict[str, dict[int, int]]:
    return {c.name: {s.index: s.mem_units for s in c.gpus} for c in allocation.containers}


def test_equal_containers_get_equal_layouts_when_the_memory_does_not_divide() -> None:
    """gpu-count 2, two containers of 3: the device plugin can only serve equal layouts."""
    req = request(
        ContainerRequest("a", ContainerKind.APP, 3),
        ContainerRequest("b", ContainerKind.APP, 3),
        gpu_count=2,
        mem=6,
    )
    allocation = plan(req, node="n", indexes=[1, 3], unit=MemoryUnit.GiB)
    assert layouts(allocation) == {"a": {1: 2, 3: 1}, "b": {1: 2, 3: 1}}
    assert [(s.index, s.mem_units) for s in allocation.gpus] == [(1, 4), (3, 2)]
    assert req.mem_per_gpu == 4  # what the filter asks of each GPU


def test_different_containers_still_give_each_gpu_its_half() -> None:
    req = request(
        ContainerRequest("a", ContainerKind.APP, 3),
        ContainerRequest("b", ContainerKind.APP, 1),
        gpu_count=2,
        mem=4,
    )
    allocation = plan(req, node="n", indexes=[0, 1], unit=MemoryUnit.GiB)
    assert layouts(allocation) == {"a": {0: 2, 1: 1}, "b": {0: 0, 1: 1}}
    assert [s.mem_units for s in allocation.gpus] == [2, 2] and req.mem_per_gpu == 2


@given(
    st.lists(
        st.tuples(st.sampled_from(list(ContainerKind)), st.integers(1, 9)), min_size=1, max_size=6
    ),
    st.integers(1, 4),
)
def test_every_split_serves_equal_containers_alike_and_holds_what_they_use(
    containers: list[tuple[ContainerKind, int]], gpu_count: int
) -> None:
    asks = tuple(ContainerRequest(f"c{i}", k, m) for i, (k, m) in enumerate(containers))
    req = request(*asks, gpu_count=gpu_count, mem=effective_amount(asks, "mem_units"))
    allocation = plan(req, node="n", indexes=list(range(gpu_count)), unit=MemoryUnit.GiB)
    by_amount: dict[int, tuple[int, ...]] = {}
    for ask, share in zip(asks, allocation.containers, strict=True):
        layout = tuple(s.mem_units for s in share.gpus)
        assert sum(layout) == ask.mem_units and max(layout) - min(layout) <= 1
        assert by_amount.setdefault(ask.mem_units, layout) == layout
    for position, held in enumerate(allocation.gpus):
        stages = [
            (a.kind, c.gpus[position].mem_units)
            for a, c in zip(asks, allocation.containers, strict=True)
        ]
        assert held.mem_units == counted(stages)
    assert sum(s.mem_units for s in allocation.gpus) >= req.mem_units
    if len({a.mem_units for a in asks}) == len(asks) and all(
        a.kind is ContainerKind.APP for a in asks
    ):
        assert max(req.mem_holding) - min(req.mem_holding) <= 1  # distinct sizes stay even


def test_init_container_gets_its_own_split() -> None:
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


def test_the_record_text_is_what_the_seal_has_always_covered() -> None:
    """The msgspec writer gives the same bytes as the json.dumps one it replaced (sealed pods
    written before keep their seals)."""
    import json

    from gpushare.core.model.containers import ContainerKind
    from gpushare.core.model.names import ANN_ALLOCATION
    from gpushare.core.records.allocation import ContainerShare, GpuShare

    allocation = Allocation(
        node="n1",
        unit=MemoryUnit.parse("128MiB"),
        gpus=(GpuShare(0, 24, 30), GpuShare(3, 24, 30)),
        containers=(
            ContainerShare("init", ContainerKind.INIT, (GpuShare(0, 8, 0),)),
            ContainerShare("app", ContainerKind.APP, (GpuShare(0, 24, 30), GpuShare(3, 24, 30))),
        ),
        uid="u",
        namespace="default",
        name="p",
    )
    text = to_annotations(allocation, dev_units=128)[ANN_ALLOCATION]
    share = lambda s: {"index": s.index, "mem": s.mem_units, "core": s.core_pct}  # noqa: E731
    before = {
        "version": 1,
        "node": "n1",
        "unit": "128MiB",
        "gpus": [share(s) for s in allocation.gpus],
        "containers": [
            {"name": c.name, "kind": c.kind.value, "gpus": [share(s) for s in c.gpus]}
            for c in allocation.containers
        ],
    }
    assert text == json.dumps(before, separators=(",", ":"))


def test_a_broken_record_names_the_field() -> None:
    import pytest

    from gpushare.core.records.allocation import RecordError, read_record

    cases = {
        '{"node":"n","gpus":[{"index":0,"mem":-1}]}': "gpus[0].mem: Expected `int` >= 0",
        '{"node":"n","gpus":[{"index":true,"mem":1}]}': "gpus[0].index: Expected `int`",
        '{"gpus":[]}': "record: Object missing required field `node`",
        '{"node":"n","gpus":[],"containers":[{"kind":"job","gpus":[]}]}': "containers[0].kind",
        "[1]": "record: Expected `object`",
        "{": "not JSON",
    }
    for text, message in cases.items():
        with pytest.raises(RecordError) as raised:
            read_record(text)
        assert str(raised.value).startswith(message), (text, str(raised.value))
