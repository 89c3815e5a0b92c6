"""The dashboard tests' PromQL evaluator agrees with Prometheus on what the dashboard uses."""

from __future__ import annotations

import pytest

from ..promql import Unsupported, evaluate, labelled, merge, scrape

TEXT = """\
# TYPE m gauge
m{node="a",gpu="0"} 2
m{node="a",gpu="1"} 3
m{node="ab",gpu="0"} 5
# TYPE t gauge
t{node="a",gpu="0"} 4
t{node="a",gpu="1"} 4
t{node="ab",gpu="0"} 10
"""


def samples() -> dict:  # type: ignore[type-arg]
    return merge(scrape(TEXT, {"instance": "x"}), scrape(TEXT, {"instance": "y"}))


def test_regex_matchers_are_anchored_and_missing_labels_are_empty() -> None:
    got = evaluate('sum(m{node=~"a"})', samples())
    assert got == {frozenset(): 10.0}  # "ab" does not match "a"; two instances
    assert evaluate('count(m{zone=~".*"})', samples()) == {frozenset(): 6.0}
    assert evaluate('count(m{zone!~".+"})', samples()) == {frozenset(): 6.0}


def test_aggregation_grouping_and_one_to_one_division() -> None:
    per_gpu = 'max by (node, gpu) (m{node=~"$node"})'
    got = evaluate(f"sum by (node) ({per_gpu})", samples(), {"node": ".*"})
    assert labelled(got, "node") == {("a",): 5.0, ("ab",): 5.0}
    ratio = evaluate("max by (node, gpu) (m) / max by (node, gpu) (t)", samples())
    assert labelled(ratio, "node", "gpu") == {("a", "0"): 0.5, ("a", "1"): 0.75, ("ab", "0"): 0.5}
    per_instance = evaluate("m / t", samples())  # matched on every label, instance too
    assert len(labelled(per_instance, "node", "gpu", "instance")) == 6


def test_or_vector_and_comparison_filter() -> None:
    assert evaluate('sum(m{node="none"}) or vector(0)', samples()) == {frozenset(): 0.0}
    assert evaluate("sum(m) or vector(0)", samples()) == {frozenset(): 20.0}
    assert len(evaluate("m > 2", samples())) == 4  # type: ignore[arg-type]


def test_what_one_scrape_cannot_answer_is_refused() -> None:
    for expr in ("rate(m[5m])", "m[5m]", "sum(m) > bool 1", "m{node=$x}"):
        with pytest.raises(Unsupported):
            evaluate(expr, samples())
