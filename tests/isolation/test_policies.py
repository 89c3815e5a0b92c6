"""cGPU policies on the fake driver: several containers launch flat out on one fake GPU.

Each container is a ``launches`` process with an interposer built to read its own limits file
(the path is compiled in), all sharing one fake SM (``FAKE_GPU_STATE``); the schedule is the
one ``gpushare.isolation.policy`` computes and the device plugin would write. Each process prints
the fake SM time its own kernels took over the second half of the run (``own=``), which is the
share the policy gave it. The numbers are printed (``pytest -s``); ``benchmarks/cgpu_policies.py``
prints them as a table.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpushare.isolation.policy import Policy
from harness.fakegpu.built import Built
from harness.fakegpu.policies import (
    MAX_PODS,
    Containers,
    Run,
    build_containers,
    members,
    run_policy,
)

pytestmark = pytest.mark.skipif(
    shutil.which("gcc") is None, reason="gcc not found: the interposer tests compile C"
)


@pytest.fixture(scope="module")
def containers(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Containers:
    return build_containers(tmp_path_factory.mktemp("policies"))


def best_of(attempts: int, run: callable, ok: callable) -> Run:  # type: ignore[valid-type]
    """A timing measure on a shared 2-core machine: the best of a few runs counts."""
    result = run()
    for _ in range(attempts - 1):
        if ok(result):
            break
        result = run()
    return result


def test_native_policy_leaves_the_gpu_to_its_own_scheduling(
    built: Built,
    containers: Containers,
    tmp_path: Path,
) -> None:
    """Policy 5: no schedule; three flat-out launchers split the fake SM as it comes."""
    result = run_policy(built, containers, tmp_path, Policy.NATIVE, members())
    assert sum(result.own) > 3 * 100 / MAX_PODS + 20, result


def test_even_policy_gives_each_container_one_slot_of_the_most_a_gpu_holds(
    built: Built,
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
    built: Built,
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
    built: Built,
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
    built: Built,
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
    built: Built,
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
