"""Steps of real programs under the limits: workloads, the preload's overhead, long kernels.

``workloads`` and the GPU half of ``kernels`` need PyTorch; each probe without it is recorded
``skipped`` with the reason. ``overhead`` and ``kernels`` run their plumbing in rehearsal on the
fake driver (tiny fake kernels launched through ctypes; fake kernels of the given duration).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
from typing import Any

from . import figures
from .figures import Recorder
from .sampling import NvmlSampler
from .setting import (
    GiB,
    Setting,
    broker,
    container,
    last_json,
    modules_missing,
    run_child,
    start_child,
)

WORK_MEM = 8 * GiB
WORK_CORE = 50
TOLERANCE_PTS = 5.0
KERNEL_MS = (1, 10, 50, 200)
KERNEL_CORE = 30


def quick() -> bool:
    return os.environ.get("GPUSHARE_GPU_QUICK") == "1"


# ------------------------------------------------------------------ workloads


WORKLOADS = {
    "graphs": {},
    "expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    "amp": {},
    "compile": {},
}
"""Each workload's extra environment (the same with and without the limits)."""


def workloads(s: Setting, rec: Recorder) -> None:
    """Each workload alone unlimited, then in one container of 8 GiB and 50 %; then two
    processes of the amp loop in that container together.

    Equal results: the same checksum (seeded, deterministic). Limits held: the container's
    memory is 8 GiB (the expandable run fills to out of memory and must stop at it). Share: the
    limited rate over the unlimited one, and NVML's time share of the process where it has one.
    """
    if missing := modules_missing(["torch"]):
        figures.finish(s.figures, "workloads", "skipped", 0, missing)
        raise SystemExit(0)
    seconds = "1" if quick() else "3"
    cuda_cache = {"TORCHINDUCTOR_CACHE_DIR": str(s.work / "inductor")}
    amp: dict[str, Any] = {}
    with NvmlSampler() as sampler, broker(s) as b:
        for kind, extra in WORKLOADS.items():
            if kind == "compile":  # last: its compiling may take the rest of the step's time
                two_processes(s, rec, b, seconds, amp)
            base = run_child(
                s,
                {**s.base_env(), **extra, **cuda_cache},
                "torch_workload",
                kind,
                seconds,
                timeout=150,
            )
            env = container(s, b, 0, WORK_MEM, core_pct=WORK_CORE)
            env.update(extra, GPUSHARE_CORE_LIMIT=str(WORK_CORE), **cuda_cache)
            limited = run_child(s, env, "torch_workload", kind, seconds, timeout=150)
            alone, held_ = base.result, limited.result
            nvml = sampler.sm_pct_any(*held_["loop_wall"]) if "loop_wall" in held_ else None
            if kind == "amp":
                amp = alone
            value: dict[str, Any] = {
                "unlimited": alone or {"rc": base.rc, "stderr_tail": base.stderr[-600:]},
                "limited": held_ or {"rc": limited.rc, "stderr_tail": limited.stderr[-600:]},
            }
            if "per_s" in alone and "per_s" in held_:
                value["rate_share_pct"] = round(100 * held_["per_s"] / alone["per_s"], 1)
                value["nvml_sm_pct"] = nvml
                share = nvml if nvml is not None else value["rate_share_pct"]
                rec.check(
                    f"{kind}: same result as unlimited", alone["checksum"] == held_["checksum"]
                )
                rec.check(
                    f"{kind}: share within {TOLERANCE_PTS:g} points of {WORK_CORE} %",
                    abs(share - WORK_CORE) <= TOLERANCE_PTS,
                )
            if kind == "expandable" and "reserved_at_oom" in held_:
                rec.check("expandable: stops at 8 GiB", 0 < held_["reserved_at_oom"] <= WORK_MEM)
                rec.check("expandable: sees 8 GiB", held_.get("total") == WORK_MEM)
            if "error" in alone or "error" in held_ or not alone or not held_:
                rec.check(f"{kind}: runs", False)
            rec.figure(kind, value)


def two_processes(s: Setting, rec: Recorder, b: Any, seconds: str, alone: dict[str, Any]) -> None:
    """Two amp loops in one container of 8 GiB and 50 %: their rates' sum against one alone
    (the amp workload's unlimited run)."""
    env = container(s, b, 0, WORK_MEM, core_pct=WORK_CORE)
    env["GPUSHARE_CORE_LIMIT"] = str(WORK_CORE)
    procs = [start_child(s, env, "torch_workload", "amp", seconds, "sync") for _ in range(2)]
    for p in procs:  # both warm and checksummed, then both timed at once
        assert p.stdout is not None
        p.stdout.readline()
    for p in procs:
        assert p.stdin is not None
        with contextlib.suppress(BrokenPipeError):  # one that died is reported below
            p.stdin.write("go\n")
            p.stdin.flush()
    got = []
    for p in procs:
        out, err = p.communicate(timeout=150)
        got.append(last_json(out) or {"rc": p.returncode, "stderr_tail": err[-600:]})
    value: dict[str, Any] = {"alone": alone, "processes": got}
    if "per_s" in alone and all("per_s" in g for g in got):
        value["sum_share_pct"] = round(100 * sum(g["per_s"] for g in got) / alone["per_s"], 1)
        rec.check(
            f"two processes: their sum within {TOLERANCE_PTS:g} points of {WORK_CORE} %",
            abs(value["sum_share_pct"] - WORK_CORE) <= TOLERANCE_PTS,
        )
        rec.check(
            "two processes: same result as unlimited",
            all(g["checksum"] == alone["checksum"] for g in got),
        )
    else:
        rec.check("two processes: run", False)
    rec.figure("two_processes_one_container", value)


# ------------------------------------------------------------------ overhead


VARIANTS = ("plain", "plain_again", "preload", "preload_limit")
"""``plain_again`` is a second unpreloaded process: its ratio to ``plain`` is the method's noise."""


def overhead(s: Setting, rec: Recorder) -> None:
    """50,000 tiny launches, plain and preloaded, by interleaved repetitions.

    One long-lived process per variant, each warm, asked in turn for a batch of 50,000 launches
    (wall clock from the first launch to the synchronize after the last), round after round:
    plain, plain_again, preload, preload_limit, then the next round in the reverse order. Two
    warm-up rounds are discarded, then 12 are kept (``paired``). Each variant's overhead is the
    median over rounds of its batch time over plain's in the same round; the median of
    ``plain_again``'s ratios, and the spread of all ratios, say how much of that is noise. No
    process start, no import and no CUDA context is inside any figure, and neighbouring batches
    see the same machine state.
    """
    if s.rehearsal:
        kind, count, rounds = "driver", 2000, 4
    elif missing := modules_missing(["torch"]):
        figures.finish(s.figures, "overhead", "skipped", 0, missing)
        raise SystemExit(0)
    else:
        kind, count, rounds = "torch", 50_000, 6 if quick() else 12
    warm_rounds = 2
    pin = {"GPUSHARE_GPU_PIN": str(min(2, (os.cpu_count() or 1) - 1))}
    fast = {"FAKE_KERNEL_US": "1"} if s.rehearsal else {}
    with broker(s) as b:
        envs = {
            "plain": s.base_env(),
            "plain_again": s.base_env(),
            "preload": {**s.base_env(), "LD_PRELOAD": str(s.interposer)},
            "preload_limit": container(s, b, 0, WORK_MEM),
        }
        procs = {
            name: start_child(s, {**env, **pin, **fast}, "launch_batches", kind, "5000")
            for name, env in envs.items()
        }
        try:
            for name, p in procs.items():
                assert p.stdout is not None
                if not last_json(p.stdout.readline()).get("ready"):
                    _, err = p.communicate(timeout=30)
                    raise RuntimeError(f"launch_batches under {name} failed: {err[-600:]}")
            times: dict[str, list[float]] = {name: [] for name in VARIANTS}
            value: dict[str, Any] = {}
            for r in range(warm_rounds + rounds):
                order = VARIANTS if r % 2 == 0 else tuple(reversed(VARIANTS))
                for name in order:
                    times[name].append(batch(procs[name], count))
                if r >= warm_rounds:  # the figure so far, in case the step is cut off
                    value = {
                        "kind": kind,
                        "count": count,
                        "rounds": r + 1 - warm_rounds,
                        "warm_rounds_discarded": warm_rounds,
                        **paired(times, warm_rounds),
                    }
                    rec.figure("launches", value)
        finally:
            for p in procs.values():
                with contextlib.suppress(Exception):
                    p.communicate(timeout=30)
    rec.check(
        "overhead: the method's noise (plain against plain) under 1 %", value["noise_pct"] < 1
    )
    for name in ("preload", "preload_limit"):
        rec.check(f"overhead: {name} 3 % or less", value[f"{name}_pct"] <= 3)


def paired(times: dict[str, list[float]], warm: int) -> dict[str, Any]:
    """Each variant against ``plain`` round by round, the first ``warm`` rounds left out: the
    median of its per-round ratios as a percentage over plain (``<name>_pct``), their
    interquartile range in points (``<name>_iqr_pts``), and the noise, ``plain_again``'s
    distance from plain (``noise_pct``). The kept times are in ``seconds``."""
    kept = {name: t[warm:] for name, t in times.items()}
    value: dict[str, Any] = {"seconds": {k: [round(x, 5) for x in v] for k, v in kept.items()}}
    for name in VARIANTS[1:]:
        ratios = [x / p for x, p in zip(kept[name], kept["plain"], strict=True)]
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        value[f"{name}_pct"] = round(100 * (statistics.median(ratios) - 1), 2)
        value[f"{name}_iqr_pts"] = round(100 * (q[2] - q[0]), 2)
    value["noise_pct"] = abs(value["plain_again_pct"])
    return value


def batch(p: subprocess.Popen[str], count: int) -> float:
    assert p.stdin is not None and p.stdout is not None
    p.stdin.write(f"{count}\n")
    p.stdin.flush()
    got = last_json(p.stdout.readline())
    if "seconds" not in got:
        raise RuntimeError(f"a batch of launches got {got!r}")
    return float(got["seconds"])


# ------------------------------------------------------------------ long kernels


def kernels(s: Setting, rec: Recorder) -> None:
    """The share taken under 30 % by a process whose kernels last 1, 10, 50 and 200 ms.

    A slice of the 100 ms period cannot cut a kernel short: a kernel longer than the slice runs
    to its end, and the share it takes is what this records. On a GPU: ``children.spin`` (a
    clock64 spin of the given duration through ``torch.cuda._sleep``); in rehearsal the fake
    driver's kernels of that duration (``FAKE_KERNEL_US``) on its shared fake SM.
    """
    from .steps import Workload, summary

    if not s.rehearsal and (missing := modules_missing(["torch"])):
        figures.finish(s.figures, "kernels", "skipped", 0, missing)
        raise SystemExit(0)
    seconds = "1" if quick() else "3"
    per_ms: list[str] = []
    if not s.rehearsal:
        calibrated = run_child(s, s.base_env(), "spin", "1", "0.2", timeout=60)
        rec.figure("calibration_unlimited", calibrated.result or {"stderr": calibrated.stderr})
        per_ms = [str(calibrated.result["cycles_per_ms"])]
    with NvmlSampler() as sampler, broker(s) as b:
        work = Workload(s, sampler)
        work.seconds = float(seconds)
        for ms in KERNEL_MS:
            env = container(s, b, 0, WORK_MEM, core_pct=KERNEL_CORE)
            env["GPUSHARE_CORE_LIMIT"] = str(KERNEL_CORE)
            probe = f"kernel_{ms}ms"
            if s.rehearsal:
                env["FAKE_KERNEL_US"] = str(ms * 1000)
                (shares,) = work.run([env])
                each = summary(shares, KERNEL_CORE, work.window)
                rec.figure(probe, {"ms": ms, "process": each})
                share = each["steady_pct"]
            else:
                out = run_child(s, env, "spin", str(ms), seconds, *per_ms, timeout=60)
                got = dict(out.result)
                if "second_half_wall" in got:  # NVML over the stretch of the spin's own share
                    got["nvml_sm_pct"] = sampler.sm_pct_any(*got["second_half_wall"])
                if out.rc:
                    got["stderr_tail"] = out.stderr[-600:]
                rec.figure(probe, got)
                share = got.get("nvml_sm_pct") or got.get("share_pct") or -100
            rec.check(
                f"{ms} ms kernels: share within {TOLERANCE_PTS:g} points of {KERNEL_CORE} %",
                abs(share - KERNEL_CORE) <= TOLERANCE_PTS,
            )
