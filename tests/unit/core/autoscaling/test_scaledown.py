"""The scale-down guard: a node stays while its GPUs are used or its pods fit nowhere else."""

from __future__ import annotations

import pytest

from gpushare.core.autoscaling.scaledown import guards
from gpushare.core.booking.ledger import Ledger
from gpushare.core.model.inventory import NodeInventory, read_node
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.allocation import Allocation, GpuShare
from gpushare.kube.objects import gpu_node


def _node(name: str, gpus: int = 4, units: int = 16) -> NodeInventory:
    return read_node(gpu_node(name, gpus_units=[units] * gpus), cluster_unit=MemoryUnit.GiB)


def _hold(ledger: Ledger, node: str, pod: str, *shares: tuple[int, int]) -> None:
    ledger.assume(
        Allocation(
            uid=f"{node}-{pod}",
            namespace="ns",
            name=pod,
            node=node,
            unit=MemoryUnit.GiB,
            gpus=tuple(GpuShare(index=i, mem_units=m) for i, m in shares),
        )
    )


def test_full_gpus_keep_a_node_an_empty_one_may_go() -> None:
    nodes = {n: _node(n) for n in ("full", "empty")}
    ledger = Ledger()
    for i in range(4):
        _hold(ledger, "full", f"p{i}", (i, 16))
    out = guards(nodes, ledger)
    assert out["full"].needed and "100% used" in out["full"].reason
    assert not out["empty"].needed


def test_a_node_whose_pods_fit_nowhere_else_gpu_by_gpu_stays() -> None:
    # the trap in reverse: four 9 GiB pods; the other node has 7 GiB free on each GPU, 28 in
    # all, which by totals holds 3 of them; GPU by GPU none
    nodes = {"a": _node("a", gpus=8), "b": _node("b")}
    ledger = Ledger()
    for i in range(4):
        _hold(ledger, "a", f"p{i}", (i, 9))
        _hold(ledger, "b", f"q{i}", (i, 9))
    out = guards(nodes, ledger)
    assert out["a"].needed and "would not all fit" in out["a"].reason
    assert out["b"].needed  # 56 % used


def test_pods_that_fit_elsewhere_let_the_node_go_and_the_room_is_not_counted_twice() -> None:
    nodes = {n: _node(n) for n in ("a", "b", "c")}
    ledger = Ledger()
    _hold(ledger, "a", "p", (0, 10))
    _hold(ledger, "b", "q", (0, 10))
    for i in range(3):  # c: 16+6 free... enough for one 10 GiB pod only
        _hold(ledger, "c", f"r{i}", (i + 1, 16))
    _hold(ledger, "c", "s", (0, 10))
    out = guards(nodes, ledger)
    # a goes first (its pod fits b's free GPUs); then b's pod has c's 6 GiB GPU only, and a's
    # room is gone with a
    assert not out["a"].needed
    assert out["b"].needed
    assert out["c"].needed


def test_a_pod_over_two_gpus_needs_one_node_with_both() -> None:
    nodes = {"a": _node("a"), "b": _node("b", gpus=1), "c": _node("c", gpus=1)}
    ledger = Ledger()
    _hold(ledger, "a", "p", (0, 4), (1, 4))
    out = guards(nodes, ledger)
    assert out["a"].needed  # b and c have one GPU each: not one node with two


def test_the_threshold_is_checked() -> None:
    with pytest.raises(ValueError, match=r"scaleDownUtilizationThreshold=0"):
        guards({}, Ledger(), threshold=0)
