"""Samples as Prometheus stores them after scraping several targets, for the dashboard tests.

Each target's series carry the target's own labels (``instance``, ``namespace``, ...), as
Kubernetes discovery adds them. The expressions themselves are evaluated by Prometheus's own
engine (``tests/support/promqlengine.py``), not here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from prometheus_client.parser import text_string_to_metric_families

Labels = frozenset[tuple[str, str]]
Vector = dict[Labels, float]

NAME = "__name__"


def scrape(text: str, target: Mapping[str, str]) -> Vector:
    """Samples of one /metrics text, with the target's labels added (they win, as by default)."""
    out: Vector = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = {**sample.labels, **target, NAME: sample.name}
            out[frozenset(labels.items())] = sample.value
    return out


def merge(*scrapes: Vector) -> Vector:
    """The series of several targets, as one Prometheus holds them."""
    out: Vector = {}
    for one in scrapes:
        clash = out.keys() & one.keys()
        assert not clash, f"two targets gave the same series: {sorted(clash)[:3]}"
        out.update(one)
    return out


def labelled(vector: Vector, *names: str) -> dict[tuple[str, ...], float]:
    """A vector's values keyed by the given labels' values (for assertions)."""
    assert isinstance(vector, dict), vector
    out: dict[tuple[str, ...], float] = {}
    for labels, value in vector.items():
        key = tuple(dict(labels).get(n, "") for n in names)
        assert key not in out, f"two series for {key}"
        out[key] = value
    return out


def names_in(exprs: Iterable[str]) -> set[str]:
    """Every gpushare series name the expressions mention."""
    return {name for expr in exprs for name in re.findall(r"gpushare_\w+", expr)}


TARGET_LABELS = frozenset(
    {"namespace", "pod", "container", "job", "instance", "endpoint", "service"}
)
"""Labels Prometheus's Kubernetes discovery and the Prometheus Operator's monitors give every
target; a series label of the same name would be renamed ``exported_<name>``."""


def target_label_clashes(text: str) -> set[tuple[str, str]]:
    """(series, label) of every sample in a /metrics text whose label a target label renames."""
    return {
        (sample.name, label)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        for label in sample.labels
        if label in TARGET_LABELS
    }
