"""Changing the memory unit is refused while pods on the node hold GPU memory."""

from __future__ import annotations

from typing import Any

from gpushare.core.booking.unitchange import holders, refuse_unit_change
from gpushare.core.model.names import ResourceNames
from gpushare.core.model.units import MemoryUnit
from gpushare.kube.objects import gpu_node, gpu_pod

NODE = "gpu-a"


def bound(name: str, mem: int | None = 3, phase: str = "Running", node: str = NODE) -> Any:
    pod = gpu_pod(name, mem=mem)
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": phase}
    return pod


def test_same_unit_or_no_published_unit_is_never_refused() -> None:
    node = gpu_node(NODE, gpus_units=[15])
    pods = [bound("a")]
    assert refuse_unit_change(node, pods, MemoryUnit.GiB) is None
    del node["metadata"]["annotations"]["gpushare.io/gpu-mem-unit"]
    assert refuse_unit_change(node, pods, MemoryUnit.MiB128) is None


def test_a_new_unit_with_no_holder_is_allowed() -> None:
    node = gpu_node(NODE, gpus_units=[15])
    pods = [
        bound("done", phase="Succeeded"),
        bound("failed", phase="Failed"),
        bound("cpu-only", mem=None),
        bound("elsewhere", node="gpu-b"),
    ]
    assert refuse_unit_change(node, pods, MemoryUnit.MiB128) is None


def test_a_new_unit_under_held_memory_is_refused_naming_node_units_pods_and_fix() -> None:
    node = gpu_node(NODE, gpus_units=[15])
    pods = [bound(f"train-{i}") for i in range(7)] + [bound("done", phase="Succeeded")]
    reason = refuse_unit_change(node, pods, MemoryUnit.MiB128)
    assert f"node {NODE}" in reason
    assert "gpushare.io/gpu-mem-unit=1GiB" in reason and "gpuMemoryUnit 128MiB" in reason
    assert "7 pod(s)" in reason
    assert "default/train-0, default/train-1" in reason and "and 2 more" in reason
    assert "default/done" not in reason
    assert "drain the GPU pods" in reason and "keep gpuMemoryUnit 1GiB" in reason


def test_an_unreadable_published_unit_counts_as_a_different_one() -> None:
    node = gpu_node(NODE, gpus_units=[15])
    node["metadata"]["annotations"]["gpushare.io/gpu-mem-unit"] = "1MiB"
    assert "1MiB" in refuse_unit_change(node, [bound("a")], MemoryUnit.GiB)


def test_holders_use_the_configured_resource_name_and_init_containers() -> None:
    names = ResourceNames(mem="example.com/vgpu-mem")
    pod = bound("init-only", mem=None)
    pod["spec"]["initContainers"] = [
        {"name": "warm", "resources": {"limits": {"example.com/vgpu-mem": "2"}}}
    ]
    assert holders(NODE, [pod, bound("default-name")], names) == ["default/init-only"]
