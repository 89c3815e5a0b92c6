"""The run's figures: one JSON file, rewritten whole after every figure.

A run can be cut off at any moment (a step's timeout, the lease's), and only what is on disk
comes back. So every figure is written as soon as it is known, by replacing the file with a
complete new copy (write a temporary file, then rename), never by appending to it: whatever
moment the run stops, the file is valid JSON holding every figure measured before.

Shape (``SCHEMA`` 1)::

    {"schema": 1, "mode": "gpu" | "rehearsal", "started": "<UTC>", "machine": {...},
     "steps": {"<step>": {"status": "running" | "ok" | "failed" | "skipped" | "timeout",
                          "reason": "...", "seconds": 1.2,
                          "figures": {"<probe>": {...}},
                          "skipped": {"<probe>": "<why>"},
                          "checks": {"<goal>": true | false}}}}
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

SCHEMA = 1
STATUSES = ("running", "ok", "failed", "skipped", "timeout")


def _read(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)


def start(path: Path, mode: str, machine: dict[str, Any]) -> None:
    """A new file for a run in ``mode``, with what is known of the machine."""
    if mode not in ("gpu", "rehearsal"):
        raise ValueError(f"figures mode {mode!r} is not one of 'gpu', 'rehearsal'")
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    _write(
        path, {"schema": SCHEMA, "mode": mode, "started": stamp, "machine": machine, "steps": {}}
    )


def _step(data: dict[str, Any], step: str) -> dict[str, Any]:
    entry: dict[str, Any] = data["steps"].setdefault(
        step, {"status": "running", "figures": {}, "skipped": {}, "checks": {}}
    )
    return entry


class Recorder:
    """Writes one step's figures into the run's file, each as soon as it is known."""

    def __init__(self, path: Path, step: str) -> None:
        self.path = path
        self.step = step

    def _update(self, key: str, name: str, value: object) -> None:
        data = _read(self.path)
        _step(data, self.step)[key][name] = value
        _write(self.path, data)

    def figure(self, probe: str, value: dict[str, Any]) -> None:
        """What ``probe`` measured."""
        self._update("figures", probe, value)

    def skip(self, probe: str, why: str) -> None:
        """``probe`` could not run here, and why."""
        self._update("skipped", probe, why)

    def check(self, goal: str, met: bool) -> None:
        """Whether the issue's ``goal`` was met."""
        self._update("checks", goal, bool(met))

    def machine(self, name: str, value: object) -> None:
        """Something learned about the machine."""
        data = _read(self.path)
        data["machine"][name] = value
        _write(self.path, data)


def finish(path: Path, step: str, status: str, seconds: float, reason: str = "") -> None:
    """Close ``step`` with its status (one of ``STATUSES``), its duration and why."""
    if status not in STATUSES:
        raise ValueError(f"step status {status!r} is not one of {', '.join(STATUSES)}")
    data = _read(path)
    entry = _step(data, step)
    entry["status"] = status
    entry["seconds"] = round(seconds, 2)
    if reason:
        entry["reason"] = reason
    _write(path, data)


def begin(path: Path, step: str) -> None:
    """Mark ``step`` as running (a run cut off inside it leaves it so)."""
    data = _read(path)
    _step(data, step)
    _write(path, data)
