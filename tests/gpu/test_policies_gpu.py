"""On a machine with an NVIDIA GPU: cGPU policies with three PyTorch processes on GPU 0.

Each process is a container: an interposer built to read its own limits file (version 3: the
policy, its slot, the schedule directory), and the schedule ``gpushare.isolation.policy`` lays
out for GPU 0. Each runs 4096² fp16 matmuls (a sync every 10) for 8 s; its throughput over one
process's alone, unscheduled, is its share. Printed with ``pytest -s tests/gpu``; skipped where
NVML finds no GPU or PyTorch is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gpushare.isolation import build
from gpushare.isolation.limits import ContainerLimits
from gpushare.isolation.policy import Member, Policy, schedule

from .test_isolation_gpu import MATMUL, torch_or_skip
from .test_nvml import nvml_or_skip

pytestmark = pytest.mark.gpu
MAX_PODS = 20


@pytest.fixture(scope="module")
def libs(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Path, Path]]:
    """Three (interposer, limits file) pairs."""
    nvml_or_skip()
    torch_or_skip()
    if shutil.which("gcc") is None:
        pytest.skip("gcc not found: cannot build the interposer")
    out = tmp_path_factory.mktemp("policies")
    pairs = []
    for i in range(3):
        limits = out / f"c{i}" / "limits"
        limits.parent.mkdir()
        pairs.append((build.build(out / f"c{i}" / build.LIB_NAME, limits_file=str(limits)), limits))
    return pairs


def shares(
    libs: list[tuple[Path, Path]],
    tmp_path: Path,
    policy: Policy,
    members: list[Member],
    running: int = 3,
) -> list[float]:
    """Each running container's matmul rate, as a percent of one unscheduled process alone."""
    sched = tmp_path / "sched"
    sched.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSHARE_")}
    alone = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(MATMUL)], env=env, capture_output=True, text=True
    )
    base = json.loads(alone.stdout.strip().splitlines()[-1])["per_s"]
    for (_, path), member in zip(libs, members, strict=True):
        path.write_text(
            ContainerLimits(
                (2**34,),
                round(member.share_pct) if policy is Policy.FIXED else 0,
                "1GiB",
                "/nonexistent/broker.sock",
                policy=None if policy is Policy.NATIVE else int(policy),
                weight=member.weight,
                slot=member.slot,
                sched_dir=str(sched),
                gpus=(0,),
            ).render()
        )
    plan = schedule(policy, members, max_pods=MAX_PODS, epoch_ns=time.monotonic_ns())
    (sched / "gpu0").write_text(plan.render())
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(MATMUL)],
            env={**env, "LD_PRELOAD": str(lib), "CUDA_VISIBLE_DEVICES": "0"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for lib, _ in libs[:running]
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    got = []
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-4000:]
        got.append(100 * json.loads(out.strip().splitlines()[-1])["per_s"] / base)
    print(f"policy {int(policy)} {policy.name.lower()}: {[round(g, 1) for g in got]} % of alone")
    return got


def three(shares_pct: tuple[float, ...] = (0, 0, 0), weights: tuple[int, ...] = (1, 1, 1)):  # type: ignore[no-untyped-def]
    return [Member(f"c{i}", shares_pct[i], weights[i]) for i in range(3)]


def test_even_gives_each_a_twentieth(libs: list[tuple[Path, Path]], tmp_path: Path) -> None:
    assert all(abs(s - 5) <= 4 for s in shares(libs, tmp_path, Policy.EVEN, three()))


def test_fixed_gives_each_its_own(libs: list[tuple[Path, Path]], tmp_path: Path) -> None:
    got = shares(libs, tmp_path, Policy.FIXED, three((10, 20, 40)))
    assert all(abs(g - s) <= 10 for g, s in zip(got, (10, 20, 40), strict=True))


def test_preemptive_splits_evenly(libs: list[tuple[Path, Path]], tmp_path: Path) -> None:
    got = shares(libs, tmp_path, Policy.PREEMPTIVE, three())
    assert max(got) - min(got) <= 10 and sum(got) >= 70


def test_weighted_follows_the_weights(libs: list[tuple[Path, Path]], tmp_path: Path) -> None:
    got = shares(libs, tmp_path, Policy.WEIGHTED, three(weights=(1, 2, 3)))
    assert all(abs(g / sum(got) - w / 6) <= 0.08 for g, w in zip(got, (1, 2, 3), strict=True))


def test_soft_uses_idle_time(libs: list[tuple[Path, Path]], tmp_path: Path) -> None:
    assert shares(libs, tmp_path, Policy.SOFT, three(), running=1)[0] >= 60


def test_native_is_unscheduled(libs: list[tuple[Path, Path]], tmp_path: Path) -> None:
    assert sum(shares(libs, tmp_path, Policy.NATIVE, three())) >= 70
