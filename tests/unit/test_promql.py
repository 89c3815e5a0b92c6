"""Samples as Prometheus holds them after scraping several targets (tests/support/promql.py)."""

from __future__ import annotations

import pytest

from tests.support.promql import labelled, merge, names_in, scrape

TEXT = """\
# TYPE m gauge
m{node="a",gpu="0"} 2
m{node="ab",gpu="0"} 5
"""


def test_each_target_adds_its_labels_and_they_win() -> None:
    got = scrape('# TYPE m gauge\nm{instance="inner",gpu="0"} 2\n', {"instance": "x"})
    assert got == {frozenset({("__name__", "m"), ("gpu", "0"), ("instance", "x")}): 2.0}


def test_two_targets_merge_and_the_same_series_twice_is_refused() -> None:
    both = merge(scrape(TEXT, {"instance": "x"}), scrape(TEXT, {"instance": "y"}))
    assert len(both) == 4
    with pytest.raises(AssertionError, match="same series"):
        merge(scrape(TEXT, {"instance": "x"}), scrape(TEXT, {"instance": "x"}))


def test_labelled_keys_values_by_label() -> None:
    values = labelled(scrape(TEXT, {"instance": "x"}), "node")
    assert values == {("a",): 2.0, ("ab",): 5.0}


def test_names_in_finds_the_gpushare_series() -> None:
    assert names_in(["sum(rate(gpushare_bind_total[5m])) / gpushare_x_bytes"]) == {
        "gpushare_bind_total",
        "gpushare_x_bytes",
    }
