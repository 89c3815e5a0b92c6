"""The loopback cluster's seed nodes: what the seeds show, as the device plugin would report it."""

from __future__ import annotations

from typing import Any

import pytest

from gpushare.core.model.inventory import Mode, Placement, read_node
from gpushare.core.model.names import ANN_NODE_HANDOFF, ANN_NODE_UNIT
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.handoff import CORE, MEM
from gpushare.deviceplugin.kubelet.devices import devices
from gpushare.node.gpus import FakeGpus
from harness.seeding import (
    CORE_NODE,
    KWOK_ANNOTATION,
    SHARE_IP,
    SHARE_NODE,
    seed_nodes,
    unit_option,
)


def by_name(unit: MemoryUnit) -> dict[str, dict[str, Any]]:
    return {node["metadata"]["name"]: node for node in seed_nodes(unit)}


def test_seed_nodes_at_1gib_are_the_seeds() -> None:
    nodes = by_name(MemoryUnit.GiB)
    assert list(nodes) == [SHARE_NODE, CORE_NODE]
    share, core = nodes[SHARE_NODE], nodes[CORE_NODE]
    assert share["metadata"]["labels"]["ack.node.gpu.schedule"] == "share"
    assert share["status"]["capacity"]["aliyun.com/gpu-mem"] == "15"
    assert share["status"]["addresses"] == [{"type": "InternalIP", "address": SHARE_IP}]
    labels = core["metadata"]["labels"]
    assert labels["ack.node.gpu.schedule"] == "core_mem"
    assert labels["ack.node.gpu.placement"] == "binpack"
    for key in ("capacity", "allocatable"):  # the seed's `kubectl get node -o yaml`
        status = core["status"][key]
        assert status["aliyun.com/gpu-core.percentage"] == "400"
        assert status["aliyun.com/gpu-count"] == "4"
        assert status["aliyun.com/gpu-mem"] == "60"


@pytest.mark.parametrize("unit", list(MemoryUnit))
def test_capacity_is_what_the_device_plugin_advertises(unit: MemoryUnit) -> None:
    for name, spec in ((SHARE_NODE, "1x15GiB"), (CORE_NODE, "4x15GiB")):
        node = by_name(unit)[name]
        gpus = FakeGpus.parse(spec, node=name).gpus()
        capacity = node["status"]["capacity"]
        assert capacity["aliyun.com/gpu-mem"] == str(len(devices(MEM, gpus, unit)))
        assert capacity["aliyun.com/gpu-count"] == str(len(gpus))
        if name == CORE_NODE:
            assert capacity["aliyun.com/gpu-core.percentage"] == str(len(devices(CORE, gpus, unit)))
        else:
            assert "aliyun.com/gpu-core.percentage" not in capacity


@pytest.mark.parametrize(("unit", "per_gpu"), [(MemoryUnit.GiB, 15), (MemoryUnit.MiB128, 120)])
def test_the_extender_reads_the_seed_nodes_in_their_unit(unit: MemoryUnit, per_gpu: int) -> None:
    share = read_node(by_name(unit)[SHARE_NODE])  # the cluster unit left at its default
    core = read_node(by_name(unit)[CORE_NODE])
    assert (share.mode, share.unit, share.unit_declared) == (Mode.SHARE, unit, True)
    assert [g.mem_units for g in share.gpus] == [per_gpu]
    assert (core.mode, core.placement) == (Mode.CORE_MEM, Placement.BINPACK)
    assert [g.mem_units for g in core.gpus] == [per_gpu] * 4
    assert not share.problem and not core.problem


def test_seed_nodes_are_kwok_nodes_without_a_handoff_marker() -> None:
    for node in seed_nodes(MemoryUnit.MiB128):
        annotations = node["metadata"]["annotations"]
        assert annotations[KWOK_ANNOTATION] == "fake"
        assert annotations[ANN_NODE_UNIT] == "128MiB"
        assert ANN_NODE_HANDOFF not in annotations  # no device plugin would ever mark pods served


@pytest.mark.parametrize(
    ("text", "unit"), [("1GiB", MemoryUnit.GiB), ("128MiB", MemoryUnit.MiB128)]
)
def test_unit_option_reads_both_units(text: str, unit: MemoryUnit) -> None:
    assert unit_option(text) is unit


@pytest.mark.parametrize("text", ["256MiB", "2GiB", "128", ""])
def test_a_bad_unit_names_the_field_the_value_the_rule_and_the_fix(text: str) -> None:
    with pytest.raises(ValueError) as err:
        unit_option(text)
    message = str(err.value)
    assert f"UNIT={text!r}" in message
    assert "gpuMemoryUnit" in message and "1GiB, 128MiB" in message
    assert "make cluster UNIT=128MiB" in message
