"""``kubectl inspect cgpu --explain``: the what-if view and its golden renderings."""

from __future__ import annotations

import json
from collections.abc import Callable

from gpushare.inspect.explain import explanation_json
from gpushare.inspect.render import render_explanation
from tests.support.inspecting import explain


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
