"""``kubectl inspect cgpu --explain``: the what-if view and its golden renderings."""

from __future__ import annotations

import json
from collections.abc import Callable

from gpushare.core.booking.ledger import Ledger
from gpushare.core.decision.scheduling import Scheduler
from gpushare.core.model.inventory import Mode, read_node
from gpushare.core.model.requests import PodRequest, read_pod
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.allocation import plan
from gpushare.inspect.explain import Explanation, explain_pod, explanation_json
from gpushare.inspect.render import render_explanation
from gpushare.kube.objects import gpu_node, gpu_pod


def cluster() -> tuple[list[object], Ledger]:
    nodes = [
        read_node(gpu_node("node-a", gpus_units=[15, 15])),
        read_node(gpu_node("node-b", gpus_units=[15])),
        read_node(gpu_node("node-c", gpus_units=[16], mode=Mode.CORE_MEM)),
        read_node(gpu_node("node-x", gpus_units=[15], mode=None)),
    ]
    ledger = Ledger()
    for uid, node, mem, index in [
        ("a0", "node-a", 12, 0),
        ("a1", "node-a", 4, 1),
        ("b", "node-b", 2, 0),
    ]:
        pod = gpu_pod(uid, mem=mem)
        pod["metadata"]["uid"] = uid
        request = read_pod(pod)
        assert isinstance(request, PodRequest)
        ledger.assume(plan(request, node=node, indexes=[index], unit=MemoryUnit.GiB))
    return nodes, ledger


def explain(mem: int, core: int | None = None) -> Explanation:
    nodes, ledger = cluster()
    pod = gpu_pod("train", mem=mem, core=core, namespace="team-a")
    pod["metadata"]["uid"] = "t"
    pod["status"] = {"phase": "Pending"}
    before = ledger.state()
    explanation = explain_pod(pod, nodes, ledger, Scheduler())  # type: ignore[arg-type]
    assert ledger.state() == before  # the what-if books nothing
    return explanation


def test_pod_that_fits_some_nodes(golden: Callable[[str, str], None]) -> None:
    e = explain(10)
    text = render_explanation(e)
    golden("explain_fits.txt", text)
    by_node = {n.node: n for n in e.nodes}
    assert by_node["node-a"].fits == "yes" and by_node["node-a"].gpus == (1,)
    assert by_node["node-a"].placement == "GPU1 on node-a, 14/15 GiB"
    assert by_node["node-b"].fits == "yes"
    assert by_node["node-c"].fits == "never" and by_node["node-x"].fits == "never"
    assert e.verdict.startswith("2/4 nodes in the cluster pass gpushare's checks; best score")


def test_pod_that_fits_nowhere(golden: Callable[[str, str], None]) -> None:
    e = explain(14)
    golden("explain_refused.txt", render_explanation(e))
    assert e.verdict.startswith("0/4 nodes in the cluster pass gpushare's checks: ")
    assert "GPU0: 3/15 GiB free < 14 GiB requested" in e.verdict
    golden("explain_refused.json", json.dumps(explanation_json(e), indent=2, sort_keys=True) + "\n")


def test_invalid_pod_is_never_anywhere() -> None:
    e = explain(2, core=33)
    assert e.rejection and all(n.fits == "never" for n in e.nodes)
    assert "INVALID:" in render_explanation(e)
