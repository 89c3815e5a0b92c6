"""The device plugin's preflight: the node's mode label decides whether it starts, and what."""

from __future__ import annotations

from typing import Any

import pytest

from gpushare.core.model.inventory import SHARED_MODES, Mode
from gpushare.core.model.names import DEFAULT_NAMES, LABEL_MODE
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.handoff import CORE, MEM
from gpushare.node.enforcement.hook import NoIsolation
from gpushare.node.preflight import Preflight, preflight


class Recording(NoIsolation):
    """A hook that remembers the modes it was asked to prepare for."""

    def __init__(self) -> None:
        self.prepared: list[Mode] = []

    def prepare(self, mode: Mode) -> str | None:
        self.prepared.append(mode)
        return None


def node(labels: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": "gpu-1", "labels": labels}, "status": {}}


def check(labels: dict[str, str], hook: Recording) -> Preflight:
    return preflight(node(labels), [], unit=MemoryUnit.GiB, names=DEFAULT_NAMES, hook=hook)


@pytest.mark.parametrize("mode", SHARED_MODES)
def test_a_shared_mode_starts_and_the_hook_prepares_for_it(mode: Mode) -> None:
    hook = Recording()
    checked = check({LABEL_MODE: mode.value}, hook)
    assert (checked.mode, checked.refused, hook.prepared) == (mode, None, [mode])
    assert checked.resources == ([MEM, CORE] if mode is Mode.CORE_MEM else [MEM])


def test_a_node_without_the_label_is_served_as_share() -> None:
    hook = Recording()
    checked = check({}, hook)
    assert (checked.mode, checked.refused, hook.prepared) == (Mode.SHARE, None, [Mode.SHARE])


@pytest.mark.parametrize("value", ["exclusive", "none", "default", "mig", "", "Share"])
def test_a_label_that_is_not_a_shared_mode_refuses_to_start(value: str) -> None:
    hook = Recording()
    checked = check({LABEL_MODE: value}, hook)
    assert checked.mode is Mode.NONE and hook.prepared == []
    assert checked.refused == (
        f"node gpu-1 has label ack.node.gpu.schedule={value!r}, which is not a mode gpushare "
        f"shares GPUs in (allowed: share, cgpu, core_mem, mps), so the scheduler places no GPU "
        f"memory here: label the node with one of them (kubectl label node gpu-1 --overwrite "
        f"ack.node.gpu.schedule=share), or keep the device plugin off it (the chart's "
        f"devicePlugin.nodeModes)"
    )


def test_a_node_labelled_for_dra_is_refused_by_the_device_plugin() -> None:
    hook = Recording()
    checked = check({"gpushare.io/allocation-mode": "dra"}, hook)
    assert checked.refused is not None
    assert "gpushare.io/allocation-mode=dra" in checked.refused
    assert "gpushare.io/allocation-mode=device-plugin" in checked.refused  # what to do
    assert hook.prepared == []


def test_a_node_labelled_for_the_device_plugin_starts() -> None:
    checked = check({"gpushare.io/allocation-mode": "device-plugin"}, Recording())
    assert checked.refused is None
