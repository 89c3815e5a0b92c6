"""cGPU policies over several containers that launch flat out on one fake GPU.

Each container is a ``launches`` process with an interposer built to read its own limits file,
all sharing one fake SM (``FAKE_GPU_STATE``); the schedule is the one
``gpushare.isolation.policy`` computes (``tests/isolation/test_policies.py`` checks the shares,
``benchmarks/cgpu_policies.py`` tabulates them).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from gpushare.isolation import build
from gpushare.isolation.limits import ContainerLimits
from gpushare.isolation.policy import Member, Policy, schedule
from harness.fakegpu.built import Built

MAX_PODS = 20
CONTAINERS = 3


@dataclass(frozen=True)
class Containers:
    """Interposers that each read their own limits file, and the schedule directory."""

    libs: tuple[Path, ...]
    limits: tuple[Path, ...]
    sched_dir: Path


def build_containers(out: Path) -> Containers:
    """``CONTAINERS`` interposers, each built to read its own limits file, under ``out``."""
    libs, limits = [], []
    for i in range(CONTAINERS):
        path = out / f"c{i}" / "limits"
        path.parent.mkdir()
        libs.append(build.build(out / f"c{i}" / build.LIB_NAME, limits_file=str(path)))
        limits.append(path)
    sched = out / "sched"
    sched.mkdir()
    return Containers(tuple(libs), tuple(limits), sched)


@dataclass(frozen=True)
class Run:
    """What each container's launcher printed."""

    own: tuple[float, ...]
    """Percent of the fake SM's time each container's kernels took (second half of the run)."""
    util: float
    """The fake SM's utilisation, everyone's kernels."""


def run_policy(
    built: Built,
    containers: Containers,
    tmp_path: Path,
    policy: Policy,
    members: list[Member],
    running: int = CONTAINERS,
    seconds: float = 3.0,
) -> Run:
    """Write the limits files and the schedule, run ``running`` launchers together."""
    for i, path in enumerate(containers.limits):
        scheduled = policy is not Policy.NATIVE
        limits = ContainerLimits(
            (2**30,),
            round(members[i].share_pct) if policy is Policy.FIXED else 0,
            "1GiB",
            "/nonexistent/broker.sock",
            policy=int(policy) if scheduled else None,
            weight=members[i].weight,
            slot=members[i].slot,
            sched_dir=str(containers.sched_dir),
            gpus=(0,),
        )
        path.write_text(limits.render())
    plan = schedule(policy, members, max_pods=MAX_PODS, epoch_ns=time.monotonic_ns())
    (containers.sched_dir / "gpu0").write_text(plan.render())
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSHARE_")}
    env.update(
        GPUSHARE_REAL_CUDA=str(built.cuda),
        GPUSHARE_REAL_NVML=str(built.nvml),
        FAKE_GPU_STATE=str(tmp_path / "gpu"),
    )
    procs = [
        subprocess.Popen(
            [str(built.dir / "launches"), str(seconds)],
            env={**env, "LD_PRELOAD": str(containers.libs[i])},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(running)
    ]
    outs = [p.communicate(timeout=60) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
        assert "gpushare:" not in err, err
    own = tuple(float(re.search(r"own=([\d.]+)", o).group(1)) for o, _ in outs)  # type: ignore[union-attr]
    util = max(float(re.search(r"util=([\d.]+)", o).group(1)) for o, _ in outs)  # type: ignore[union-attr]
    print(f"policy {int(policy)} {policy.name.lower()}: own {own} % of the fake SM, util {util}")
    return Run(own, util)


def members(shares: tuple[float, ...] = (), weights: tuple[int, ...] = ()) -> list[Member]:
    return [
        Member(
            f"c{i}",
            share_pct=shares[i] if shares else 0.0,
            weight=weights[i] if weights else 1,
        )
        for i in range(CONTAINERS)
    ]
