"""cGPU policies with the device plugin's real schedules and activity, on fake GPUs.

The plugin's isolation hook (``harness/fakegpu/node.py``) admits the containers, serves their
broker accounts and writes the schedules; each container's interposer reports its activity on
its own connection. Two scenarios:

- a container joins two others that launch flat out and leaves again: each policy's shares
  before, during and after, and how long they take to settle after each change;
- a container with two GPUs, sharing each with a different neighbour: each GPU's schedule names
  it and gives it that GPU's share, whatever the other GPU gives it.

The numbers are printed (``pytest -s``); ``benchmarks/cgpu_policies.py`` prints them as tables.
"""

from __future__ import annotations

import shutil
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpushare.isolation.policy import Policy
from harness.fakegpu.node import (
    Container,
    FakeNode,
    Launch,
    interposers,
    run_launches,
    shared_env,
    timeline,
)
from tests.isolation.test_interposer import Built, built  # noqa: F401 (a fixture)

pytestmark = pytest.mark.skipif(
    shutil.which("gcc") is None, reason="gcc not found: the interposer tests compile C"
)

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


@pytest.fixture(scope="module")
def libs(built: Built, tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Path, Path]]:  # noqa: F811
    return interposers(tmp_path_factory.mktemp("activity"), 3)


@pytest.fixture
def make_node(tmp_path: Path) -> Iterator[list[FakeNode]]:
    nodes: list[FakeNode] = []
    yield nodes
    for node in nodes:
        node.close()


def join_and_leave(
    built: Built,  # noqa: F811
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


@pytest.mark.parametrize(
    "policy",
    [Policy.EVEN, Policy.PREEMPTIVE, Policy.WEIGHTED, Policy.FIXED, Policy.SOFT],
    ids=lambda p: p.name.lower(),
)
def test_shares_follow_the_containers_that_launch(
    built: Built,  # noqa: F811
    libs: list[tuple[Path, Path]],
    tmp_path: Path,
    policy: Policy,
) -> None:
    """Each policy's shares as ACK documents them, settling within a second of each change."""

    def ok(o: Outcome) -> bool:
        if policy is Policy.SOFT:
            # each active container has its even share and the open window on top
            return all(
                s >= 100 / MAX_PODS - 2 for phase in o.steady.values() for s in phase.values()
            ) and (sum(o.steady["ab"].values()) >= 60)
        expected = EXPECTED[policy]
        return (
            all(
                abs(o.steady[phase][c] - t) <= tolerance(t)
                for phase, shares in expected.items()
                for c, t in shares.items()
            )
            and o.join_s <= 0.6
            and o.leave_s <= 1.2
        )

    outcome = join_and_leave(built, libs, tmp_path / "try0", policy)
    for attempt in range(1, 3):  # timings on a shared 2-core machine: the best of three counts
        if ok(outcome):
            break
        outcome = join_and_leave(built, libs, tmp_path / f"try{attempt}", policy)
    assert ok(outcome), outcome


MULTI: dict[Policy, dict[tuple[str, int], float]] = {
    # a has GPUs 0 and 1; b shares GPU 1 with it (weight 1), c GPU 0 (weight 3)
    Policy.EVEN: {("a", 0): 12.5, ("c", 0): 12.5, ("a", 1): 12.5, ("b", 1): 12.5},
    Policy.PREEMPTIVE: {("a", 0): 50, ("c", 0): 50, ("a", 1): 50, ("b", 1): 50},
    Policy.WEIGHTED: {("a", 0): 25, ("c", 0): 75, ("a", 1): 50, ("b", 1): 50},
    Policy.FIXED: {("a", 0): 20, ("c", 0): 40, ("a", 1): 20, ("b", 1): 30},
    Policy.SOFT: {("a", 0): 50, ("c", 0): 50, ("a", 1): 50, ("b", 1): 50},
}


def two_gpus(
    built: Built,  # noqa: F811
    libs: list[tuple[Path, Path]],
    root: Path,
    policy: Policy,
) -> dict[tuple[str, int], float]:
    """a launches on both its GPUs (a process each), b and c on their one."""
    node = FakeNode(root, policy, MAX_PODS)
    shares = {"a": 20, "b": 30, "c": 40}
    weights = {"a": 1, "b": 1, "c": 3}
    gpus = {"a": (0, 1), "b": (1,), "c": (0,)}
    try:
        made: dict[str, Container] = {}
        for (lib, limits), name in zip(libs, "abc", strict=True):
            made[name] = node.admit(
                name, lib, limits, gpus=gpus[name], weight=weights[name], core_pct=shares[name]
            )
        for gpu in (0, 1):
            members = [n for n in "abc" if gpu in gpus[n]]
            text = node.schedule(gpu)
            assert all(f"member={made[n].limits.slot}," in text for n in members), text
        t0, pids, _ = run_launches(
            built.dir / "launches",
            node,
            shared_env(built.cuda, built.nvml),
            lambda c, d: root / f"sm{c.limits.gpus[d]}",
            [Launch("a", 0), Launch("a", 1), Launch("b", 0), Launch("c", 0)],
        )
    finally:
        node.close()
    out = {}
    for gpu in (0, 1):
        on_gpu = [p for p, launch in pids.items() if gpus[launch.container][launch.device] == gpu]
        rows = timeline(root / f"sm{gpu}", on_gpu, t0, 3.0)[15:]
        for pid in on_gpu:
            out[(pids[pid].container, gpu)] = round(statistics.mean(r[pid] for r in rows), 1)
    print(f"policy {int(policy)} {policy.name.lower()} on two GPUs: {out}")
    return out


@pytest.mark.parametrize("policy", list(MULTI), ids=lambda p: p.name.lower())
def test_a_two_gpu_container_keeps_each_gpus_own_schedule(
    built: Built,  # noqa: F811
    libs: list[tuple[Path, Path]],
    tmp_path: Path,
    policy: Policy,
) -> None:
    expected = MULTI[policy]

    def ok(got: dict[tuple[str, int], float]) -> bool:
        if policy is Policy.SOFT:
            return all(s >= 100 / MAX_PODS - 2 for s in got.values()) and all(
                got[("a", g)] + got[(n, g)] >= 60 for g, n in ((0, "c"), (1, "b"))
            )
        return all(abs(got[k] - t) <= tolerance(t) for k, t in expected.items())

    got = two_gpus(built, libs, tmp_path / "try0", policy)
    for attempt in range(1, 3):
        if ok(got):
            break
        got = two_gpus(built, libs, tmp_path / f"try{attempt}", policy)
    assert ok(got), got
