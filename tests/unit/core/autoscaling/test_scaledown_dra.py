"""The scale-down guard in DRA mode: the same decision, nodes from ResourceSlices and usage from
the allocated claims' ``consumedCapacity`` (``dra_guards``), on the e2e scale-down's numbers."""

from __future__ import annotations

from typing import Any

from gpushare.core.autoscaling.scaledown import dra_guards
from gpushare.core.dra.ledger import read_ledger
from gpushare.core.dra.slices import SliceSpec, build_slice
from gpushare.core.model.inventory import Gpu, Mode
from gpushare.core.model.names import DRA_DRIVER
from gpushare.core.model.units import MemoryUnit


def _slice(node: str) -> dict[str, Any]:
    gpus = tuple(Gpu(index=i, mem_units=16, uuid=f"GPU-{node}-{i}") for i in range(4))
    return build_slice(SliceSpec(node=node, unit=MemoryUnit.GiB, mode=Mode.SHARE, gpus=gpus))


def _claim(name: str, node: str, index: int, gib: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "main",
                            "driver": DRA_DRIVER,
                            "pool": node,
                            "device": f"gpu-{index}",
                            "consumedCapacity": {"memory": f"{gib}Gi", "cores": "0"},
                            "shareID": f"share-{name}",
                        }
                    ]
                }
            },
            "reservedFor": [{"resource": "pods", "name": name, "uid": f"pod-{name}"}],
        },
    }


B = [_claim(f"b{i}", "b", i, 11) for i in range(4)]
"""Node b: four 11 GiB claims, one a GPU (69 % of its GPU memory; 5 GiB free a GPU)."""
A = [_claim("a0", "a", 0, 9), _claim("a1", "a", 1, 9)]
"""Node a: two 9 GiB claims (28 %; GPUs with 7, 7, 16 and 16 GiB free)."""


def test_both_nodes_stay_when_the_claims_fit_nowhere_else_gpu_by_gpu() -> None:
    guards = dra_guards(read_ledger([_slice("a"), _slice("b")], [*A, *B]))
    assert guards["b"].needed and "69%" in guards["b"].reason
    assert guards["a"].needed and "would not all fit" in guards["a"].reason


def test_a_node_whose_claims_fit_on_another_may_go_and_an_empty_one_is_never_kept() -> None:
    guards = dra_guards(read_ledger([_slice("a"), _slice("b"), _slice("c")], [*A, *B]))
    assert not guards["a"].needed  # its two 9 GiB claims fit c's empty GPUs
    assert not guards["c"].needed  # empty: the autoscaler's to remove
    assert guards["b"].needed


def test_a_claim_on_a_device_no_slice_publishes_is_not_counted() -> None:
    ledger = read_ledger([_slice("a")], [_claim("x", "a", 7, 9)])
    assert not dra_guards(ledger)["a"].needed
    assert ledger.problems
