"""cGPU policies on the fake GPU: the share each of three containers converges to, how fast,
and the spread over repeated runs.

Builds the interposer (one copy per container, each reading its own limits file), the fake
driver and NVML and the ``launches`` program from ``tests/isolation``, then, per policy, runs the
three containers flat out on one shared fake SM. ``early`` is each container's share of the SM
between 0.2 s and 0.4 s after start (how fast the schedule holds), ``steady`` between 1.5 s and
3 s; the spread is max - min of ``steady`` over the runs. Needs gcc.

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

from tests.isolation import test_interposer, test_policies  # noqa: E402

from gpushare.isolation.policy import Member, Policy  # noqa: E402

CASES: dict[Policy, tuple[str, Callable[[], list[Member]], int]] = {
    Policy.EVEN: ("1/20 each", lambda: test_policies.members(), 3),
    Policy.PREEMPTIVE: ("1/3 each", lambda: test_policies.members(), 3),
    Policy.WEIGHTED: ("weights 1,2,3", lambda: test_policies.members(weights=(1, 2, 3)), 3),
    Policy.FIXED: ("10,20,40 %", lambda: test_policies.members((10, 20, 40)), 3),
    Policy.SOFT: ("alone of 3", lambda: test_policies.members(), 1),
    Policy.NATIVE: ("no schedule", lambda: test_policies.members(), 3),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="gs-cgpu-"))
    factory = _Factory(out)
    built = test_interposer.built.__wrapped__(factory)  # type: ignore[attr-defined]
    containers = test_policies.containers.__wrapped__(built, factory)  # type: ignore[attr-defined]
    print(f"| policy | case | early (0.2-0.4 s) % | steady (1.5-3 s) % | spread (n={args.runs}) |")
    print("| --- | --- | --- | --- | --- |")
    for policy, (case, members, running) in CASES.items():
        early = test_policies.run_policy(
            built, containers, out, policy, members(), running, seconds=0.4
        )
        steady = [
            test_policies.run_policy(built, containers, out, policy, members(), running)
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


class _Factory:
    """What the fixtures ask of pytest's TempPathFactory: a new directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def mktemp(self, name: str) -> Path:
        path = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.root))
        return path


if __name__ == "__main__":
    main()
