"""cGPU policies on the fake driver: several containers launch flat out on one fake GPU.

Each container is a ``launches`` process with an interposer built to read its own limits file
(the path is compiled in), all sharing one fake SM (``FAKE_GPU_STATE``); the schedule is the
one ``gpushare.isolation.policy`` computes and the device plugin would write. Each process prints
the fake SM time its own kernels took over the second half of the run (``own=``), which is the
share the policy gave it. The numbers are printed (``pytest -s``); ``benchmarks/cgpu_policies.py``
prints them as a table.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpushare.isolation import build
from gpushare.isolation.limits import ContainerLimits
from gpushare.isolation.policy import Member, Policy, schedule
from tests.isolation.test_interposer import Built, built  # noqa: F401 (a fixture)

pytestmark = pytest.mark.skipif(
    shutil.which("gcc") is None, reason="gcc not found: the interposer tests compile C"
)

MAX_PODS = 20
CONTAINERS = 3


@dataclass(frozen=True)
class Containers:
    """Interposers that each read their own limits file, and the schedule directory."""

    libs: tuple[Path, ...]
    limits: tuple[Path, ...]
    sched_dir: Path


@pytest.fixture(scope="module")
def containers(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Containers:  # noqa: F811
    out = tmp_path_factory.mktemp("policies")
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
    built: Built,  # noqa: F811
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


def best_of(attempts: int, run: callable, ok: callable) -> Run:  # type: ignore[valid-type]
    """A timing measure on a shared 2-core machine: the best of a few runs counts."""
    result = run()
    for _ in range(attempts - 1):
        if ok(result):
            break
        result = run()
    return result


def test_native_policy_leaves_the_gpu_to_its_own_scheduling(
    built: Built,  # noqa: F811
    containers: Containers,
    tmp_path: Path,
) -> None:
    """Policy 5: no schedule; three flat-out launchers split the fake SM as it comes."""
    result = run_policy(built, containers, tmp_path, Policy.NATIVE, members())
    assert sum(result.own) > 3 * 100 / MAX_PODS + 20, result


def test_even_policy_gives_each_container_one_slot_of_the_most_a_gpu_holds(
    built: Built,  # noqa: F811
    containers: Containers,
    tmp_path: Path,
) -> None:
    """Policy 0: 1/20 of the GPU each, however idle the rest of it is."""
    expected = 100 / MAX_PODS
    result = best_of(
        3,
        lambda: run_policy(built, containers, tmp_path, Policy.EVEN, members()),
        lambda r: all(abs(o - expected) <= 2 for o in r.own),
    )
    assert all(abs(o - expected) <= 2 for o in result.own), result


def test_fixed_policy_holds_each_container_to_its_own_share(
    built: Built,  # noqa: F811
    containers: Containers,
    tmp_path: Path,
) -> None:
    """Policy 3: 10 %, 20 % and 40 % of the GPU, each its own."""
    shares = (10.0, 20.0, 40.0)
    result = best_of(
        3,
        lambda: run_policy(built, containers, tmp_path, Policy.FIXED, members(shares)),
        lambda r: all(abs(o - s) <= 4 for o, s in zip(r.own, shares, strict=True)),
    )
    assert all(abs(o - s) <= 4 for o, s in zip(result.own, shares, strict=True)), result


def test_preemptive_policy_splits_the_gpu_among_its_containers(
    built: Built,  # noqa: F811
    containers: Containers,
    tmp_path: Path,
) -> None:
    """Policy 1: a third each, and together as much as the launchers manage flat out."""
    result = best_of(
        3,
        lambda: run_policy(built, containers, tmp_path, Policy.PREEMPTIVE, members()),
        lambda r: max(r.own) - min(r.own) <= 6 and sum(r.own) >= 50,
    )
    assert max(result.own) - min(result.own) <= 6, result
    assert sum(result.own) >= 50, result


def test_weighted_policy_shares_in_proportion_to_the_weights(
    built: Built,  # noqa: F811
    containers: Containers,
    tmp_path: Path,
) -> None:
    """Policy 2: weights 1, 2 and 3 get a sixth, a third and a half of the time they use."""
    weights = (1, 2, 3)

    def fractions(r: Run) -> list[float]:
        return [o / sum(r.own) for o in r.own]

    def ok(r: Run) -> bool:
        return all(abs(f - w / 6) <= 0.05 for f, w in zip(fractions(r), weights, strict=True))

    result = best_of(
        3,
        lambda: run_policy(built, containers, tmp_path, Policy.WEIGHTED, members(weights=weights)),
        ok,
    )
    assert ok(result), (result, fractions(result))


def test_soft_policy_lets_a_container_use_the_idle_time_the_even_one_does_not(
    built: Built,  # noqa: F811
    containers: Containers,
    tmp_path: Path,
) -> None:
    """Policies 4 and 0 with one of three containers launching: soft takes the idle time."""
    even = run_policy(built, containers, tmp_path, Policy.EVEN, members(), running=1)
    soft = best_of(
        3,
        lambda: run_policy(built, containers, tmp_path, Policy.SOFT, members(), running=1),
        lambda r: r.own[0] >= 40,
    )
    assert abs(even.own[0] - 100 / MAX_PODS) <= 2, even
    assert soft.own[0] >= 40, soft
