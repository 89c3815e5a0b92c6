"""The device plugin's checkpoint of what Allocate served: decoded whole, never half-read."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from gpushare.core.records.handoff import Signature
from gpushare.deviceplugin.checkpoint import ServedCheckpoint

SIGNATURE = Signature(
    resource="aliyun.com/gpu-mem",
    count=3,
    layout=((0, 2), (1, 1)),
    pod_mem_units=3,
    core_layout=((0, 30),),
)


def test_a_restart_reads_back_what_was_served(tmp_path: Path) -> None:
    path = tmp_path / "served.json"
    ServedCheckpoint(path).remember(["b", "a"], SIGNATURE)
    assert ServedCheckpoint(path).signature(["a", "b"]) == SIGNATURE
    # the file keeps the format written before msgspec: asdict's field names, lists for tuples
    assert json.loads(path.read_text()) == {
        "a,b": {
            "resource": "aliyun.com/gpu-mem",
            "count": 3,
            "layout": [[0, 2], [1, 1]],
            "pod_mem_units": 3,
            "core_layout": [[0, 30]],
        }
    }


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('{"a": {"resource": "r", "count": "3", "layout": [], "pod_mem_units": 1}}', "count"),
        ('{"a": {"resource": "r", "count": 3, "layout": [[0]], "pod_mem_units": 1}}', "layout"),
        ('{"a": {"count": 3, "layout": [], "pod_mem_units": 1}}', "resource"),
        ("[]", "object"),
        ("{", "truncated"),
    ],
)
def test_a_damaged_file_starts_empty_and_says_where(
    tmp_path: Path, text: str, where: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "served.json"
    path.write_text(text)
    with caplog.at_level(logging.WARNING):
        checkpoint = ServedCheckpoint(path)
    assert checkpoint.signature(["a"]) is None  # unknown to the check, never a crash
    assert where in caplog.text and "starting empty" in caplog.text
