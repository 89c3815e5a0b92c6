"""The published GPU topology and the best-connected set for multi-GPU pods."""

from __future__ import annotations

import json

import pytest

from gpushare.core.booking.ledger import Ledger
from gpushare.core.model.inventory import NodeInventory, read_node
from gpushare.core.model.names import ANN_NODE_TOPOLOGY
from gpushare.core.model.requests import PodRequest, read_pod
from gpushare.core.model.topology import closest_set, topology_annotation
from gpushare.core.placement.filtering import Rules, filter_node
from gpushare.core.records.allocation import plan
from gpushare.kube.objects import gpu_node, gpu_pod

# Two NVLink pairs (0-1, 2-3) on one NUMA node each, the pairs across sockets.
PAIRS = ((0, 1, 6, 6), (1, 0, 6, 6), (6, 6, 0, 1), (6, 6, 1, 0))


def req(mem: int, count: str, name: str = "p") -> PodRequest:
    pod = gpu_pod(name, mem=mem, gpu_count=count)
    pod["metadata"]["uid"] = f"uid-{name}"
    result = read_pod(pod)
    assert isinstance(result, PodRequest)
    return result


def node(distance: object | None, gpus: int = 4, placement: str | None = None) -> NodeInventory:
    obj = gpu_node("n1", gpus_units=[15] * gpus, placement=placement)
    if distance is not None:
        text = distance if isinstance(distance, str) else topology_annotation(distance)  # type: ignore[arg-type]
        obj["metadata"]["annotations"][ANN_NODE_TOPOLOGY] = text
    return read_node(obj)


def test_round_trip_and_kind() -> None:
    inv = node(PAIRS)
    assert inv.distance == PAIRS and not inv.topology_problem
    assert inv.kind != node(None).kind


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("nope", "is not JSON"),
        (json.dumps({"version": 2, "distance": []}), "version 2 is not known"),
        (json.dumps({"version": 1, "distance": [[0]]}), "distance has 1 rows for 4 GPUs"),
        (
            json.dumps({"version": 1, "distance": [[0, 1, 6, 6], [1, 0, 6], [6, 6, 0, 1], []]}),
            "distance[1] has 3 entries",
        ),
        (topology_annotation([[0, 9, 6, 6], *PAIRS[1:]]), "distance[0][1]=9"),
        (topology_annotation([[1, 1, 6, 6], *PAIRS[1:]]), "distance[0][0]=1"),
        (topology_annotation([[0, 2, 6, 6], *PAIRS[1:]]), "distance[1][0]=1 but distance[0][1]=2"),
    ],
)
def test_malformed_topology_is_named_and_the_node_placed_without_it(text: str, says: str) -> None:
    inv = node(text)
    assert says in inv.topology_problem and ANN_NODE_TOPOLOGY in inv.topology_problem
    assert "symmetric 4x4 matrix" in inv.topology_problem
    assert inv.distance == () and not inv.problem
    assert filter_node(req(2, "2"), inv, Ledger().usage("n1"), rules=Rules()).fits


def test_pair_lands_on_nvlink_pair_not_on_the_packing_choice_across_sockets() -> None:
    inv, ledger = node(PAIRS), Ledger()
    # GPU1 and GPU2 hold the most, so best fit alone picks 1 and 2: across the sockets
    ledger.assume(plan(req(10, "1", "a"), node="n1", indexes=(1,), unit=inv.unit))
    ledger.assume(plan(req(10, "1", "b"), node="n1", indexes=(2,), unit=inv.unit))
    plain = filter_node(req(4, "2"), node(None), ledger.usage("n1"), rules=Rules())
    assert plain.gpus == (1, 2)
    verdict = filter_node(req(4, "2"), inv, ledger.usage("n1"), rules=Rules())
    assert verdict.fits and verdict.gpus == (0, 1)


def test_ties_keep_the_packing_order() -> None:
    flat = tuple(tuple(0 if i == j else 5 for j in range(4)) for i in range(4))
    inv, ledger = node(flat), Ledger()
    ledger.assume(plan(req(10, "1", "a"), node="n1", indexes=(3,), unit=inv.unit))
    ledger.assume(plan(req(8, "1", "b"), node="n1", indexes=(1,), unit=inv.unit))
    for placement in (None, "spread"):
        with_topology = filter_node(
            req(4, "2"), node(flat, placement=placement), ledger.usage("n1"), rules=Rules()
        )
        without = filter_node(
            req(4, "2"), node(None, placement=placement), ledger.usage("n1"), rules=Rules()
        )
        assert with_topology.gpus == without.gpus
    # and among equally good NVLink pairs, the fuller pair (best fit) wins
    assert filter_node(req(4, "2"), inv, ledger.usage("n1"), rules=Rules()).gpus == (1, 3)
    # two NVLink pairs tie; the one holding best fit's first choice (GPU3, the fullest) wins
    paired = node(PAIRS)
    assert filter_node(req(4, "2"), paired, ledger.usage("n1"), rules=Rules()).gpus == (2, 3)


def test_closest_set_prefers_the_smallest_worst_pair_then_the_sum() -> None:
    # 0-1-2 chained by NVLink, 3 far: three GPUs should be 0, 1, 2
    chain = ((0, 1, 2, 6), (1, 0, 1, 6), (2, 1, 0, 6), (6, 6, 6, 0))
    position = {i: i for i in range(4)}
    assert closest_set([3, 0, 1, 2], 3, chain, position) == (0, 1, 2)
    assert closest_set([3, 2, 1, 0], 2, chain, position) == (1, 2)
    assert closest_set([3, 2], 1, chain, position) == (3,)


def test_disabled_gpus_are_not_in_the_set() -> None:
    obj = gpu_node("n1", gpus_units=[15] * 4)
    obj["metadata"]["annotations"][ANN_NODE_TOPOLOGY] = topology_annotation(PAIRS)
    obj["metadata"]["annotations"]["gpushare.io/gpus-disabled"] = "0"
    verdict = filter_node(req(4, "2"), read_node(obj), Ledger().usage("n1"), rules=Rules())
    assert verdict.gpus == (2, 3)
