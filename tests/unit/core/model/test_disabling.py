"""GPUs out of service by ``gpushare.io/gpus-disabled``: filter, ledger, inspect, supply."""

from __future__ import annotations

import pytest

from gpushare.core.booking.ledger import Ledger
from gpushare.core.model.disabling import parse_disabled
from gpushare.core.model.inventory import NodeInventory, read_node
from gpushare.core.model.names import ANN_NODE_GPUS_DISABLED
from gpushare.core.model.requests import PodRequest, read_pod
from gpushare.core.placement.filtering import Code, Rules, filter_node
from gpushare.core.placement.survey import free_units
from gpushare.core.records.allocation import plan
from gpushare.inspect.render import render_details, render_summary
from gpushare.inspect.view import build_view, to_json
from gpushare.kube.objects import gpu_node, gpu_pod


def req(mem: int, name: str = "p", count: str | None = None) -> PodRequest:
    pod = gpu_pod(name, mem=mem, gpu_count=count)
    pod["metadata"]["uid"] = f"uid-{name}"
    result = read_pod(pod)
    assert isinstance(result, PodRequest)
    return result


def node(gpus: list[int], disabled: str | None) -> NodeInventory:
    obj = gpu_node("n1", gpus_units=gpus, ip="10.0.0.1")
    if disabled is not None:
        obj["metadata"]["annotations"][ANN_NODE_GPUS_DISABLED] = disabled
    return read_node(obj)


def test_parse_accepts_spaces_duplicates_and_empty() -> None:
    assert parse_disabled(" 1, 3,1 ", node="n", indexes=[0, 1, 2, 3]) == (frozenset({1, 3}), "")
    assert parse_disabled("", node="n", indexes=[0]) == (frozenset(), "")


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("one", "'one' is not an integer"),
        ("-1", "'-1' is not an integer"),
        ("1.5", "'1.5' is not an integer"),
        ("4", "GPU 4 is not on this node (it has GPU 0, 1, 2, 3)"),
    ],
)
def test_malformed_value_is_the_node_problem_naming_annotation_value_and_rule(
    value: str, says: str
) -> None:
    inv = node([15, 15, 15, 15], value)
    assert says in inv.problem
    assert f"{ANN_NODE_GPUS_DISABLED}={value!r}" in inv.problem
    assert "comma-separated" in inv.problem and "kubectl annotate --overwrite" in inv.problem
    # Loud, not silent: the filter refuses with that reason, the supply counts nothing free,
    # and inspect -d shows it.
    verdict = filter_node(req(1), inv, Ledger().usage("n1"), rules=Rules())
    assert verdict.code is Code.UNRESOLVABLE and verdict.reasons == (inv.problem,)
    assert free_units(inv, Ledger().usage("n1")) == (0, 0, 0, 0)
    assert f"PROBLEM:    {inv.problem}" in render_details(build_view([inv], Ledger()))


def test_filter_skips_a_disabled_gpu_with_a_reason() -> None:
    inv = node([15, 15], "0")
    assert [g.disabled for g in inv.gpus] == [True, False]
    verdict = filter_node(req(3), inv, Ledger().usage("n1"), rules=Rules())
    assert verdict.fits and verdict.gpus == (1,)
    both = node([15, 15], "0,1")
    refused = filter_node(req(3), both, Ledger().usage("n1"), rules=Rules())
    assert refused.code is Code.UNSCHEDULABLE
    assert refused.reasons == (
        f"GPU0: out of service ({ANN_NODE_GPUS_DISABLED} on the node)",
        f"GPU1: out of service ({ANN_NODE_GPUS_DISABLED} on the node)",
    )


def test_multi_gpu_pod_cannot_use_a_disabled_gpu() -> None:
    inv = node([15, 15, 15], "1")
    verdict = filter_node(req(6, count="2"), inv, Ledger().usage("n1"), rules=Rules())
    assert verdict.fits and verdict.gpus == (0, 2)


def test_pods_already_there_keep_their_share_and_show_in_inspect() -> None:
    inv, ledger = node([15, 15], "1"), Ledger()
    ledger.assume(plan(req(5, name="old"), node="n1", indexes=(1,), unit=inv.unit))
    usage = ledger.usage("n1")
    assert usage.on(1).mem_units == 5
    assert free_units(inv, usage) == (15, 0)
    view = build_view([inv], ledger)
    summary = render_summary(view)
    assert "5/15*" in summary and "0/15*" not in summary
    assert f"Note: * marks a GPU out of service ({ANN_NODE_GPUS_DISABLED}): n1 GPU1." in summary
    assert "GPU1(Allocated)*" in render_details(view)
    gpus = to_json(view)["nodes"][0]["gpus"]
    assert [g["outOfService"] for g in gpus] == [False, True]


def test_removing_the_annotation_puts_the_gpu_back() -> None:
    assert not any(g.disabled for g in node([15, 15], None).gpus)
    assert node([15, 15], None).kind != node([15, 15], "1").kind
    summary = render_summary(build_view([node([15, 15], None)], Ledger()))
    assert "*" not in summary
