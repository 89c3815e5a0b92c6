"""cGPU policies on the fake GPU: the share each of three containers converges to, how fast,
and the spread over repeated runs.

Builds the interposer (one copy per container, each reading its own limits file), the fake
driver and NVML and the ``launches`` program from ``harness/fakegpu``, then, per policy, runs the
three containers flat out on one shared fake SM. ``early`` is each container's share of the SM
between 0.2 s and 0.4 s after start (how fast the schedule holds), ``steady`` between 1.5 s and
3 s; the spread is max - min of ``steady`` over the runs.

A second table runs the device plugin's own schedules and activity tracking
(``harness/fakegpu/activity.py``): a and b launch for 4.5 s, c joins at 1.5 s and leaves at
3 s (weights 1, 2, 3; fixed shares 10, 20, 40 %; 8 pods per GPU). It prints the steady shares
of each stretch, the time each change took to settle (every share within max(4 points, 12 %)
of its target in two 100 ms windows in a row) and the spread of the steady shares over the
runs. Needs gcc.

    python benchmarks/cgpu_policies.py [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpushare.isolation.policy import Member, Policy  # noqa: E402
from harness.fakegpu import activity as joining  # noqa: E402
from harness.fakegpu import policies  # noqa: E402
from harness.fakegpu.built import Built, build_all  # noqa: E402
from harness.fakegpu.node import interposers  # noqa: E402

CASES: dict[Policy, tuple[str, Callable[[], list[Member]], int]] = {
    Policy.EVEN: ("1/20 each", lambda: policies.members(), 3),
    Policy.PREEMPTIVE: ("1/3 each", lambda: policies.members(), 3),
    Policy.WEIGHTED: ("weights 1,2,3", lambda: policies.members(weights=(1, 2, 3)), 3),
    Policy.FIXED: ("10,20,40 %", lambda: policies.members((10, 20, 40)), 3),
    Policy.SOFT: ("alone of 3", lambda: policies.members(), 1),
    Policy.NATIVE: ("no schedule", lambda: policies.members(), 3),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="gs-cgpu-"))
    factory = _Factory(out)
    built = build_all(factory.mktemp("native"))
    containers = policies.build_containers(factory.mktemp("policies"))
    print(f"| policy | case | early (0.2-0.4 s) % | steady (1.5-3 s) % | spread (n={args.runs}) |")
    print("| --- | --- | --- | --- | --- |")
    for policy, (case, members, running) in CASES.items():
        early = policies.run_policy(built, containers, out, policy, members(), running, seconds=0.4)
        steady = [
            policies.run_policy(built, containers, out, policy, members(), running)
            for _ in range(args.runs)
        ]
        means = [statistics.mean(r.own[i] for r in steady) for i in range(running)]
        spread = max(
            max(r.own[i] for r in steady) - min(r.own[i] for r in steady) for i in range(running)
        )
        print(
            f"| {int(policy)} {policy.name.lower()} | {case} | "
            f"{', '.join(f'{o:.1f}' for o in early.own)} | "
            f"{', '.join(f'{m:.1f}' for m in means)} | {spread:.1f} |",
            flush=True,
        )
    activity(built, out, args.runs)


def activity(built: Built, out: Path, runs: int) -> None:
    """The join-and-leave scenario with the plugin's schedules, per scheduled policy."""
    libs = interposers(out / "activity-libs", 3)
    print()
    print(
        "| policy | a, b (0.6-1.5 s) % | a, b, c (2-3 s) % | a, b again (3.9-4.5 s) % "
        f"| settles after c joins / leaves, s | spread (n={runs}) |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for policy in joining.EXPECTED | {Policy.SOFT: {}}:
        outcomes = [
            joining.join_and_leave(built, libs, out / f"p{int(policy)}-{i}", policy)
            for i in range(runs)
        ]
        cells = []
        for phase in joining.PHASES:
            names = phase.split()[0]
            cells.append(
                ", ".join(
                    f"{statistics.mean(o.steady[phase][c] for o in outcomes):.1f}" for c in names
                )
            )
        spread = max(
            max(o.steady[p][c] for o in outcomes) - min(o.steady[p][c] for o in outcomes)
            for p in joining.PHASES
            for c in p.split()[0]
        )
        join = max(o.join_s for o in outcomes)
        leave = max(o.leave_s for o in outcomes)
        print(
            f"| {int(policy)} {policy.name.lower()} | {' | '.join(cells)} "
            f"| {join:.1f} / {leave:.1f} | {spread:.1f} |",
            flush=True,
        )


class _Factory:
    """What the fixtures ask of pytest's TempPathFactory: a new directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def mktemp(self, name: str) -> Path:
        path = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.root))
        return path


if __name__ == "__main__":
    main()
