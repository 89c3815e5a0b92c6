"""A container joins two others on one fake GPU and leaves again, under the plugin's schedules.

a and b launch flat out throughout; c joins at ``JOIN_S`` and leaves at ``LEAVE_S``. The steady
shares of each stretch and how long each change takes to settle, per policy
(``tests/isolation/test_activity.py`` checks them, ``benchmarks/cgpu_policies.py`` tabulates them).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from gpushare.isolation.policy import Policy
from harness.fakegpu.built import Built
from harness.fakegpu.node import FakeNode, Launch, run_launches, shared_env, timeline

MAX_PODS = 8
JOIN_S, LEAVE_S, END_S = 1.5, 3.0, 4.5
WEIGHTS = {"a": 1, "b": 2, "c": 3}
FIXED = {"a": 10, "b": 20, "c": 40}
PHASES = {"ab": (0.6, JOIN_S), "abc": (JOIN_S + 0.5, LEAVE_S), "ab again": (LEAVE_S + 0.9, END_S)}
"""Steady stretches of the run (seconds) and, in the name's first word, who launches."""
EXPECTED: dict[Policy, dict[str, dict[str, float]]] = {
    Policy.EVEN: {p: {c: 100 / MAX_PODS for c in p.split()[0]} for p in PHASES},
    Policy.PREEMPTIVE: {"ab": {"a": 50, "b": 50}, "abc": dict.fromkeys("abc", 100 / 3)},
    Policy.WEIGHTED: {
        "ab": {"a": 100 / 3, "b": 200 / 3},
        "abc": {"a": 100 / 6, "b": 100 / 3, "c": 50},
    },
    Policy.FIXED: {p: {c: FIXED[c] for c in p.split()[0]} for p in PHASES},
}
for _p in (Policy.PREEMPTIVE, Policy.WEIGHTED):
    EXPECTED[_p]["ab again"] = EXPECTED[_p]["ab"]


@dataclass(frozen=True)
class Outcome:
    """Steady shares per phase and how long each change took to settle."""

    steady: dict[str, dict[str, float]]
    join_s: float
    leave_s: float


def tolerance(target: float) -> float:
    return max(4.0, 0.12 * target)


def settle_time(
    rows: list[dict[str, float]], event_s: float, until_s: float, target: dict[str, float]
) -> float:
    """Seconds after ``event_s`` until every share is within tolerance in two windows in a row."""
    first, last = int(event_s / 0.1), int(until_s / 0.1)
    for w in range(first, last - 1):
        if all(abs(rows[x][c] - t) <= tolerance(t) for x in (w, w + 1) for c, t in target.items()):
            return round(w * 0.1 - event_s + 0.1, 1)
    return float("inf")


def join_and_leave(
    built: Built,
    libs: list[tuple[Path, Path]],
    root: Path,
    policy: Policy,
) -> Outcome:
    """a and b launch throughout; c joins at JOIN_S and leaves at LEAVE_S."""
    node = FakeNode(root, policy, MAX_PODS)
    try:
        for (lib, limits), name in zip(libs, "abc", strict=True):
            node.admit(name, lib, limits, weight=WEIGHTS[name], core_pct=FIXED[name])
        state = root / "sm0"
        t0, pids, _ = run_launches(
            built.dir / "launches",
            node,
            shared_env(built.cuda, built.nvml),
            lambda c, d: state,
            [
                Launch("a", seconds=END_S),
                Launch("b", seconds=END_S),
                Launch("c", start_s=JOIN_S, seconds=LEAVE_S - JOIN_S),
            ],
        )
    finally:
        node.close()
    rows_by_pid = timeline(state, list(pids), t0, END_S)
    rows = [{pids[p].container: share for p, share in row.items()} for row in rows_by_pid]
    steady = {
        phase: {
            c: round(statistics.mean(r[c] for r in rows[int(lo / 0.1) : int(hi / 0.1)]), 1)
            for c in phase.split()[0]
        }
        for phase, (lo, hi) in PHASES.items()
    }
    # soft: even shares plus the open window, which flat-out launchers split evenly
    expected = EXPECTED[Policy.PREEMPTIVE if policy is Policy.SOFT else policy]
    join = settle_time(rows, JOIN_S, LEAVE_S, expected["abc"]) if expected else 0.0
    leave = settle_time(rows, LEAVE_S, END_S, expected["ab again"]) if expected else 0.0
    outcome = Outcome(steady, join, leave)
    print(f"policy {int(policy)} {policy.name.lower()}: {outcome}")
    return outcome
