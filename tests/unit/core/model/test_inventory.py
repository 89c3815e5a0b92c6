"""Node inventory: labels, the device plugin's annotations, and derivation from capacity."""

from __future__ import annotations

from typing import Any

import pytest

from gpushare.core.model.inventory import Mode, Placement, read_node
from gpushare.core.model.names import ANN_NODE_GPUS, ANN_NODE_UNIT
from gpushare.core.model.units import MemoryUnit
from gpushare.kube.objects import gpu_node


def bare(
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    capacity: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {"name": "n", "labels": labels or {}, "annotations": annotations or {}},
        "status": {"capacity": capacity or {}, "allocatable": capacity or {}},
    }


@pytest.mark.parametrize(
    ("label", "mode"),
    [
        ("share", Mode.SHARE),
        ("cgpu", Mode.CGPU),
        ("core_mem", Mode.CORE_MEM),
        ("default", Mode.NONE),
        ("mps", Mode.MPS),
        ("topology", Mode.NONE),
        (None, Mode.NONE),
    ],
)
def test_mode_from_label(label: str | None, mode: Mode) -> None:
    labels = {"ack.node.gpu.schedule": label} if label else {}
    assert read_node(bare(labels)).mode is mode


def test_placement_defaults_to_binpack() -> None:
    assert read_node(bare()).placement is Placement.BINPACK
    spread = {"ack.node.gpu.placement": "spread"}
    assert read_node(bare(spread)).placement is Placement.SPREAD


def test_heterogeneous_gpus_from_the_device_plugin_annotation() -> None:
    node = read_node(gpu_node("n", gpus_units=[15, 80], ip="10.0.0.1", unhealthy=[1]))
    assert [(g.index, g.mem_units, g.healthy) for g in node.gpus] == [(0, 15, True), (1, 80, False)]
    assert node.ip == "10.0.0.1" and node.unit_declared and not node.problem


def test_unit_annotation_is_read() -> None:
    node = read_node(gpu_node("n", gpus_units=[120], unit=MemoryUnit.MiB128))
    assert node.unit is MemoryUnit.MiB128


def test_derived_from_capacity_when_no_annotation() -> None:
    node = read_node(bare(capacity={"aliyun.com/gpu-mem": "60", "aliyun.com/gpu-count": "4"}))
    assert [g.mem_units for g in node.gpus] == [15, 15, 15, 15]
    assert not node.unit_declared


@pytest.mark.parametrize(
    ("annotations", "needle"),
    [
        ({ANN_NODE_GPUS: "{not json"}, "is not JSON"),
        ({ANN_NODE_GPUS: "[]"}, "non-empty JSON list"),
        ({ANN_NODE_GPUS: '[{"index": -1, "memUnits": 15}]'}, "index=-1 must be an integer >= 0"),
        ({ANN_NODE_GPUS: '[{"index": 0, "memUnits": "15"}]'}, "memUnits='15'"),
        ({ANN_NODE_GPUS: '[{"index":0,"memUnits":1},{"index":0,"memUnits":1}]'}, "twice"),
        ({ANN_NODE_UNIT: "1MiB"}, "gpuMemoryUnit='1MiB' is not supported"),
        (
            {ANN_NODE_GPUS: '[{"index": 0, "memUnits": 1000000000000000000000000000000}]'},
            "[0].memUnits=1000000000000000000000000000000 is more than any GPU has "
            "(at most 1048576 units of 1GiB, 1 PiB)",
        ),
        (
            {ANN_NODE_GPUS: '[{"index": 0, "memUnits": 16106127360}]', ANN_NODE_UNIT: "128MiB"},
            "at most 8388608 units of 128MiB",
        ),
    ],
)
def test_unreadable_annotations_become_a_problem(annotations: dict[str, str], needle: str) -> None:
    node = read_node(bare(annotations=annotations))
    assert needle in node.problem and not node.gpus


def test_capacity_without_count_is_a_problem() -> None:
    node = read_node(bare(capacity={"aliyun.com/gpu-mem": "60"}))
    assert "both are needed" in node.problem


def test_no_gpu_at_all_is_a_problem() -> None:
    assert "no aliyun.com/gpu-mem capacity" in read_node(bare()).problem


def test_unit_parse_rejects_others_with_advice() -> None:
    with pytest.raises(ValueError, match="use 1GiB \\(default\\) or 128MiB"):
        MemoryUnit.parse("512MiB")


@pytest.mark.parametrize(
    ("mem", "count", "per_gpu"),
    [("1k", "4", 250), ("+60", "4", 15), ("60", "4e0", 15), ("6e1", "+4", 15)],
)
def test_capacity_in_any_spelling_kubelet_or_the_api_server_keeps(
    mem: str, count: str, per_gpu: int
) -> None:
    # kubelet writes 1000 devices as "1k" (Quantity's canonical form)
    node = read_node(bare(capacity={"aliyun.com/gpu-mem": mem, "aliyun.com/gpu-count": count}))
    assert not node.problem and [g.mem_units for g in node.gpus] == [per_gpu] * 4


def test_capacity_above_any_gpu_is_a_problem_naming_field_value_and_rule() -> None:
    capacity = {"aliyun.com/gpu-mem": "64Gi", "aliyun.com/gpu-count": "1"}
    problem = read_node(bare(capacity=capacity)).problem
    assert "capacity aliyun.com/gpu-mem='64Gi'" in problem
    assert "more than any GPU has (at most 1048576 units of 1GiB, 1 PiB)" in problem
