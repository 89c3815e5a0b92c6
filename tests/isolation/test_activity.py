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
from pathlib import Path

import pytest

from gpushare.isolation.policy import Policy
from harness.fakegpu.activity import (
    EXPECTED,
    MAX_PODS,
    Outcome,
    join_and_leave,
    tolerance,
)
from harness.fakegpu.built import Built
from harness.fakegpu.node import (
    Container,
    FakeNode,
    Launch,
    interposers,
    run_launches,
    shared_env,
    timeline,
)

pytestmark = pytest.mark.skipif(
    shutil.which("gcc") is None, reason="gcc not found: the interposer tests compile C"
)


@pytest.fixture(scope="module")
def libs(built: Built, tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Path, Path]]:
    return interposers(tmp_path_factory.mktemp("activity"), 3)


@pytest.fixture
def make_node(tmp_path: Path) -> Iterator[list[FakeNode]]:
    nodes: list[FakeNode] = []
    yield nodes
    for node in nodes:
        node.close()


@pytest.mark.parametrize(
    "policy",
    [Policy.EVEN, Policy.PREEMPTIVE, Policy.WEIGHTED, Policy.FIXED, Policy.SOFT],
    ids=lambda p: p.name.lower(),
)
def test_shares_follow_the_containers_that_launch(
    built: Built,
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
    built: Built,
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
    built: Built,
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
