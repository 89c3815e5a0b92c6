"""The run's steps, most valuable first: ``python -m tests.gpu.probes.steps STEP``.

Each step records every figure as soon as it has it (``figures.Recorder``), checks the issue's
goals as booleans and closes itself ``ok`` (a goal not met is a figure, not a crash) or
``skipped`` with the reason; ``run.py`` marks a step that crashed or ran out of time. A probe
that needs a module this machine lacks (PyTorch, CuPy, JAX here; nvidia-smi off a GPU) is
recorded under ``skipped`` with the reason and the step goes on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpushare.isolation.limits import ContainerLimits
from gpushare.isolation.policy import OPEN, Member, Policy, schedule

from . import figures, loads
from .figures import Recorder
from .sampling import NvmlSampler
from .setting import (
    BrokerProcess,
    GiB,
    MiB,
    Outcome,
    Setting,
    broker,
    container,
    from_env,
    last_json,
    modules_missing,
    run_child,
    start_child,
)

LIMIT = 2 * GiB
HOLD = 3 * GiB // 2
COMPUTE_MEM = 8 * GiB
OOM = 2  # CUDA_ERROR_OUT_OF_MEMORY
NOT_SUPPORTED = 801  # CUDA_ERROR_NOT_SUPPORTED
TOLERANCE_PTS = 5.0
MAX_PODS = 20


def figure(rec: Recorder, probe: str, out: Outcome, **extra: Any) -> dict[str, Any]:
    """Record a child's result, with its exit code and the interposer's messages."""
    said = [line for line in out.stderr.splitlines() if line.startswith("gpushare:")]
    value = {**out.result, **extra, "rc": out.rc, "seconds": round(out.seconds, 2)}
    if said:
        value["gpushare_said"] = said[:5]
    if out.rc != 0 and "error" not in value:
        value["stderr_tail"] = out.stderr[-600:]
    rec.figure(probe, value)
    return value


# ------------------------------------------------------------------ 1. memory, PyTorch first


def memory(s: Setting, rec: Recorder) -> None:
    """A 2 GiB limit: to the limit and not one MiB more; what the queries say; two processes."""
    no_torch = modules_missing(["torch"])
    with broker(s) as b:
        for probe, conf in (("torch_default", ""), ("torch_async", "backend:cudaMallocAsync")):
            if no_torch:
                rec.skip(probe, no_torch)
                continue
            env = container(s, b, 0, LIMIT)
            if conf:
                env["PYTORCH_CUDA_ALLOC_CONF"] = conf
            r = figure(rec, probe, run_child(s, env, "torch_limit", str(LIMIT)))
            rec.check(f"{probe}: mem_get_info total is the limit", r.get("total") == LIMIT)
            rec.check(f"{probe}: the limit in one tensor", r.get("at_limit") == "allocated")
            rec.check(f"{probe}: one MiB more is out of memory", r.get("one_mib_more") == "oom")
        r = figure(
            rec, "driver", run_child(s, container(s, b, 0, LIMIT), "driver_limit", str(LIMIT))
        )
        rec.check("driver: cuMemGetInfo total is the limit", r.get("total") == LIMIT)
        rec.check("driver: the limit in one allocation", r.get("at_limit") == 0)
        rec.check("driver: one MiB more is out of memory", r.get("one_mib_more") == OOM)
        r = figure(rec, "nvml", run_child(s, container(s, b, 0, LIMIT), "nvml_memory"))
        rec.check("nvml: nvmlDeviceGetMemoryInfo total is the limit", r.get("total") == LIMIT)
        nvidia_smi(s, rec, container(s, b, 0, LIMIT))
        by_uuid(s, rec, b)
        via = "driver" if no_torch else "torch"
        two_processes(s, rec, b, via)
        sigkill(s, rec, b, via)


FAKE_UUIDS = (
    "GPU-fa4e0000-0000-4000-8000-000000000000",
    "GPU-fa4e0000-0000-4000-8000-000000000001",
)
"""The fake driver's two GPUs (``harness/fakegpu/fakes/fake_cuda.c``)."""
STRANGER = "GPU-00000000-0000-4000-8000-0000000000ff"
"""A UUID no GPU has."""


def gpu_uuids(s: Setting) -> list[str]:
    """The GPUs' UUIDs as NVML gives them (nvidia-smi), in NVML's order; the fake's in rehearsal."""
    if s.rehearsal or shutil.which("nvidia-smi") is None:
        return list(FAKE_UUIDS) if s.rehearsal else []
    done = subprocess.run(
        ["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


def by_uuid(s: Setting, rec: Recorder, b: BrokerProcess) -> None:
    """The limits file names each GPU by its NVML UUID (as the plugin writes it), and the
    interposer matches the driver's ``cuDeviceGetUuid`` to it: the limit holds by UUID, a GPU
    the file does not name gets nothing, and with two GPUs listed the other way round in
    CUDA_VISIBLE_DEVICES each keeps its own limit (ordinal 0 is then the second GPU)."""
    uuids = gpu_uuids(s)
    if not uuids:
        rec.skip("uuid_limit", "no GPU UUIDs: nvidia-smi not on PATH")
        return
    mine = ContainerLimits((LIMIT,), 0, "1GiB", "/x", uuids=(uuids[0],))
    r = figure(
        rec,
        "uuid_limit",
        run_child(s, container(s, b, 0, LIMIT, limits=mine), "driver_limit", str(LIMIT)),
        uuids=uuids,
    )
    rec.check("by UUID: the limit in one allocation", r.get("at_limit") == 0)
    rec.check("by UUID: one MiB more is out of memory", r.get("one_mib_more") == OOM)
    other = ContainerLimits((LIMIT,), 0, "1GiB", "/x", uuids=(STRANGER,))
    r = figure(
        rec,
        "uuid_stranger",
        run_child(s, container(s, b, 0, LIMIT, limits=other), "driver_try", str(MiB)),
    )
    rec.check("by UUID: a GPU the file does not name gets nothing", r.get("alloc_rc") == OOM)
    if len(uuids) < 2:
        rec.skip("uuid_reversed", f"{len(uuids)} GPU: no order to reverse")
        return
    two = ContainerLimits((LIMIT, LIMIT // 2), 0, "1GiB", "/x", uuids=(uuids[0], uuids[1]))
    env = {**container(s, b, 0, LIMIT, limits=two), "CUDA_VISIBLE_DEVICES": "1,0"}
    r = figure(rec, "uuid_reversed", run_child(s, env, "driver_limit", str(LIMIT // 2)))
    rec.check(
        "reversed: ordinal 0, the second GPU, has its own limit", r.get("total") == LIMIT // 2
    )
    rec.check("reversed: its limit in one allocation", r.get("at_limit") == 0)
    rec.check("reversed: one MiB more is out of memory", r.get("one_mib_more") == OOM)


def nvidia_smi(s: Setting, rec: Recorder, env: dict[str, str]) -> None:
    if shutil.which("nvidia-smi") is None:
        rec.skip("nvidia_smi", "nvidia-smi not on PATH")
        return
    query = ["nvidia-smi", "--query-gpu=memory.total,memory.used", "--format=csv,noheader,nounits"]
    shown = {}
    for name, run_env in (("plain", s.base_env()), ("preloaded", env)):
        done = subprocess.run(query, env=run_env, capture_output=True, text=True, timeout=60)
        shown[name] = done.stdout.strip().splitlines()[:1] + done.stderr.strip().splitlines()[:2]
    rec.figure("nvidia_smi", {"query": query[1], **shown})
    first = (shown["preloaded"] or [""])[0].split(",")[0].strip()
    rec.check("nvidia-smi: total is the limit", first == str(LIMIT // MiB))


def refused(result: dict[str, Any]) -> bool:
    return result.get("alloc") == "oom" or result.get("alloc_rc") == OOM


def hold(s: Setting, env: dict[str, str], via: str) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    holder = start_child(s, env, f"{via}_hold", str(HOLD))
    assert holder.stdout is not None
    return holder, last_json(holder.stdout.readline())


def two_processes(s: Setting, rec: Recorder, b: BrokerProcess, via: str) -> None:
    """One process holds 1.5 GiB; a second of the same container asks 1 GiB."""
    env = container(s, b, 0, LIMIT)
    holder, held = hold(s, env, via)
    try:
        usage = b.usage("c0")
        second = run_child(s, env, f"{via}_try", str(GiB)).result
    finally:
        holder.kill()
        holder.wait(30)
    rec.figure("two_processes", {"via": via, "held": held, "broker_usage": usage, "second": second})
    rec.check("two processes: the broker counts the holder's 1.5 GiB", usage >= HOLD)
    rec.check("two processes: the second's 1 GiB is refused", refused(second))
    rec.check(
        "two processes: the second sees the rest as free",
        int(second.get("free", LIMIT)) <= LIMIT - HOLD,
    )


def sigkill(s: Setting, rec: Recorder, b: BrokerProcess, via: str) -> None:
    """A SIGKILLed holder's 1.5 GiB comes back: how fast, and can a new process take it."""
    env = container(s, b, 0, LIMIT)
    holder, held = hold(s, env, via)
    before = b.usage("c0")
    killed = time.monotonic()
    holder.send_signal(signal.SIGKILL)
    holder.wait(30)
    after, back_s = before, None
    while time.monotonic() - killed < 5:
        after = b.usage("c0")
        if after == 0:
            back_s = round(time.monotonic() - killed, 3)
            break
        time.sleep(0.01)
    again = run_child(s, env, f"{via}_try", str(HOLD)).result
    rec.figure(
        "sigkill",
        {
            "via": via,
            "held": held,
            "usage_before": before,
            "usage_after": after,
            "back_after_s": back_s,
            "new_process": again,
        },
    )
    rec.check("SIGKILL: the memory is back in the account", after == 0)
    rec.check(
        "SIGKILL: a new process gets the 1.5 GiB", not refused(again) and "error" not in again
    )


# ------------------------------------------------------------------ 2. other allocators


def allocators(s: Setting, rec: Recorder) -> None:
    """CuPy (default pool, async pool), JAX's preallocation, VMM, managed memory, share helper."""
    with broker(s) as b:
        no_cupy = modules_missing(["cupy"])
        for pool in ("default", "async"):
            probe = f"cupy_{pool}"
            if no_cupy:
                rec.skip(probe, no_cupy)
                continue
            env = container(s, b, 0, LIMIT)
            r = figure(rec, probe, run_child(s, env, "cupy_limit", str(LIMIT), pool))
            rec.check(f"{probe}: memGetInfo total is the limit", r.get("total") == LIMIT)
            rec.check(f"{probe}: the limit in one array", r.get("at_limit") == "allocated")
            rec.check(f"{probe}: one MiB more is out of memory", r.get("one_mib_more") == "oom")
        no_jax = modules_missing(["jax"])
        if no_jax:
            rec.skip("jax", no_jax)
        else:
            r = figure(
                rec, "jax", run_child(s, container(s, b, 0, LIMIT), "jax_prealloc", str(LIMIT))
            )
            limit = r.get("bytes_limit")
            rec.check(
                "jax: its pool is inside the slice", isinstance(limit, int) and limit <= LIMIT
            )
            rec.check(
                "jax: an array of the limit is refused",
                str(r.get("limit_more")).startswith("refused"),
            )
        r = figure(rec, "vmm", run_child(s, container(s, b, 0, LIMIT), "vmm", str(LIMIT)))
        rec.check(
            "vmm: half the limit is created and mapped",
            r.get("create_half_rc") == 0 and r.get("map_rc") == 0,
        )
        rec.check(
            "vmm: the limit while half is held is refused",
            r.get("create_limit_while_half_held_rc") == OOM,
        )
        rec.check(
            "vmm: the limit after release is created", r.get("create_limit_after_release_rc") == 0
        )
        out = run_child(s, container(s, b, 0, LIMIT), "managed")
        r = figure(rec, "managed", out)
        rec.check(
            "managed: refused with CUDA_ERROR_NOT_SUPPORTED", r.get("managed_rc") == NOT_SUPPORTED
        )
        rec.check(
            "managed: the message says why",
            "managed memory (cuMemAllocManaged) is not allowed" in out.stderr,
        )
    if no_torch := modules_missing(["torch"]):
        rec.skip("share_helper", no_torch)
        return
    env = {**s.base_env(), "ALIYUN_COM_GPU_MEM_CONTAINER": "2", "GPUSHARE_MEM_UNIT": "1GiB"}
    r = figure(rec, "share_helper", run_child(s, env, "share_helper"))
    rec.check("share helper: half the share fits", r.get("half_of_share") == "allocated")
    rec.check("share helper: over the share is out of memory", r.get("whole_share_more") == "oom")


# ------------------------------------------------------------------ 3. computing power


def quick() -> bool:
    return os.environ.get("GPUSHARE_GPU_QUICK") == "1"


class Workload:
    """Processes flat out on GPU 0, each one's share (%) of the GPU per window of time.

    On a GPU: 4096² fp16 matmuls (``children.matmul``), a share being the rate over one
    process's alone, unthrottled; beside it NVML's time share of each process over the second
    half of the run, and the SM clock (``sampling``). In rehearsal: the fake driver's
    ``launches`` on one shared fake SM, a share being the SM's time that process's kernels took
    (its kernel ring).
    """

    def __init__(self, s: Setting, sampler: NvmlSampler) -> None:
        self.s = s
        self.seconds = 1.0 if quick() else 6.0
        self.window = 0.1 if s.rehearsal else 0.25
        self.base: float | None = None
        self.runs = 0
        self.sampler = sampler
        self.nvml: list[float | None] = []
        """The last run's NVML time share (%) of each process, None where NVML said nothing."""
        self.clock: float | None = None
        """The last run's mean SM clock (MHz) over its second half."""

    def baseline(self, rec: Recorder) -> None:
        if self.s.rehearsal:
            self.base = 100.0
            return
        (r,) = self._matmuls([self.s.base_env()])
        self.base = float(r["per_s"])
        rec.figure(
            "alone_unthrottled",
            {**r, "nvml_sm_pct": self.nvml[0], "sm_clock_mhz": self.clock},
        )

    def run(self, envs: list[dict[str, str]]) -> list[list[float]]:
        self.runs += 1
        if self.s.rehearsal:
            self.nvml, self.clock = [None] * len(envs), None
            return self._fake(envs)
        assert self.base
        return [[100 * x / self.base for x in r["rates"]] for r in self._matmuls(envs)]

    def _matmuls(self, envs: list[dict[str, str]]) -> list[dict[str, Any]]:
        procs = [
            start_child(self.s, env, "matmul", str(self.seconds), str(self.window), "sync")
            for env in envs
        ]
        for p in procs:  # every one warm (imports and CUDA take seconds), then all at once
            assert p.stdout is not None
            p.stdout.readline()
        go = time.time()
        for p in procs:
            assert p.stdin is not None
            with contextlib.suppress(BrokenPipeError):  # one that died is reported below
                p.stdin.write("go\n")
                p.stdin.flush()
        results = []
        for p in procs:
            out, err = p.communicate(timeout=self.seconds + 120)
            r = last_json(out)
            if "rates" not in r:
                raise RuntimeError(f"matmul failed (exit {p.returncode}): {r or err[-600:]}")
            results.append(r)
        steady = (go + self.seconds / 2, go + self.seconds)
        self.nvml = [self.sampler.sm_pct(p.pid, *steady) for p in procs]
        self.clock = self.sampler.clock_mhz(*steady)
        return results

    def _fake(self, envs: list[dict[str, str]]) -> list[list[float]]:
        from harness.fakegpu.node import timeline

        assert self.s.fake_dir is not None
        state = self.s.work / f"fake-gpu-{self.runs}"
        t0 = time.monotonic_ns()
        procs = [
            subprocess.Popen(
                [str(self.s.fake_dir / "launches"), str(self.seconds)],
                env={**env, "FAKE_GPU_STATE": str(state)},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for env in envs
        ]
        for p in procs:
            _, err = p.communicate(timeout=self.seconds + 60)
            if p.returncode != 0:
                raise RuntimeError(f"launches failed (exit {p.returncode}): {err[-600:]}")
        rows = timeline(state, [p.pid for p in procs], t0, self.seconds, self.window)
        return [[row[p.pid] for row in rows] for p in procs]


def summary(
    shares: list[float], target: float, window: float, nvml_pct: float | None = None
) -> dict[str, Any]:
    """Steady share (second half), its distance from the target, and when it settled.

    Settled: every window from then on within ``TOLERANCE_PTS`` of the target. With NVML's time
    share (``nvml_pct``), that is the one the goal checks (see ``sampling``).
    """
    half = shares[len(shares) // 2 :]
    steady = statistics.mean(half) if half else 0.0
    settle = None
    for i in range(len(shares)):
        if all(abs(x - target) <= TOLERANCE_PTS for x in shares[i:]):
            settle = round(i * window, 2)
            break
    return {
        "target_pct": round(target, 1),
        "steady_pct": round(steady, 1),
        "off_pts": round(steady - target, 1),
        "settled_after_s": settle,
        "nvml_sm_pct": nvml_pct,
        "nvml_off_pts": None if nvml_pct is None else round(nvml_pct - target, 1),
        "windows_pct": [round(x, 1) for x in shares],
    }


def held(each: list[dict[str, Any]]) -> bool:
    """Every process within the tolerance: by NVML's time share for a process alone.

    With several processes on the GPU at once, NVML on the H100 put the GPU time of all of them
    on one pid (three policy 0 containers at 5 %: 13.9 % on the last, nothing on the others),
    so there the rates count; they ran at one clock, so they compare fairly with each other.
    """
    if len(each) == 1 and each[0]["nvml_off_pts"] is not None:
        return abs(each[0]["nvml_off_pts"]) <= TOLERANCE_PTS
    return all(abs(e["off_pts"]) <= TOLERANCE_PTS for e in each)


def compute(s: Setting, rec: Recorder) -> None:
    """A core limit alone at 30 % and 60 %, both together, then cGPU policies 0-4.

    Core limits as the device plugin gives them to core_mem containers: policy 3's schedule of
    the GPU's containers, each its share as one slice (``InterposerIsolation.policy_for``);
    then one container with only ``GPUSHARE_CORE_LIMIT`` (no schedule named: its own slice).
    """
    if not s.rehearsal and (missing := modules_missing(["torch"])):
        figures.finish(s.figures, "compute", "skipped", 0, missing)
        raise SystemExit(0)
    with NvmlSampler() as sampler, broker(s) as b:
        work = Workload(s, sampler)
        work.baseline(rec)
        for probe, cases in CORE_CASES.items():
            if probe == NO_SCHEDULE:
                envs = [container(s, b, 0, COMPUTE_MEM, core_pct=cases[0][1])]
            else:
                pcts = dict(cases)
                members = [Member(f"c{i}", pct) for i, pct in pcts.items()]
                each_env = fixed(s, b, members)
                envs = [each_env[i] for i, _ in cases]
            for env, (_, pct) in zip(envs, cases, strict=True):
                env["GPUSHARE_CORE_LIMIT"] = str(pct)
            got = work.run(envs)
            if len({i for i, _ in cases}) == len(cases):
                each = [
                    summary(g, t, work.window, n)
                    for g, (_, t), n in zip(got, cases, work.nvml, strict=True)
                ]
            else:  # one container's processes share its limit: their sum is what counts
                nvml = None  # NVML gave each of the two the whole slice (41 %): see held()
                total = [sum(w) for w in zip(*got, strict=True)]
                each = [summary(total, cases[0][1], work.window, nvml)]
            rec.figure(
                probe,
                {
                    "processes": each,
                    "seconds": work.seconds,
                    "base": work.base,
                    "sm_clock_mhz": work.clock,
                },
            )
            rec.check(f"{probe}: within {TOLERANCE_PTS:g} points", held(each))
        for policy, members, running in policy_cases():
            policies(s, rec, b, work, policy, members, running)


NO_SCHEDULE = "core_30_no_schedule"
CORE_CASES = {
    "core_30": ((0, 30),),
    "core_60": ((0, 60),),
    "core_30_and_60": ((0, 30), (1, 60)),
    "core_40_one_container_two_processes": ((0, 40), (0, 40)),
    NO_SCHEDULE: ((0, 30),),
}
"""(container, core limit %) of each process; two containers at 30 and 60 %, one container
whose two processes must share its 40 %, and one that has only ``GPUSHARE_CORE_LIMIT``."""


def fixed(s: Setting, b: BrokerProcess, members: list[Member]) -> list[dict[str, str]]:
    """Containers ``c0..`` held by policy 3's schedule of ``members``: each one's env."""
    return scheduled(s, b, Policy.FIXED, members, len(members))


def scheduled(
    s: Setting, b: BrokerProcess, policy: Policy, members: list[Member], running: int
) -> list[dict[str, str]]:
    """Write ``policy``'s schedule of ``members`` for GPU 0, as the device plugin does, and admit
    the first ``running`` of them with limits files naming it; their envs."""
    sched = s.work / "sched"
    sched.mkdir(parents=True, exist_ok=True)
    plan = schedule(policy, members, max_pods=MAX_PODS, epoch_ns=time.monotonic_ns())
    (sched / "gpu0").write_text(plan.render())
    envs = []
    for i, m in enumerate(members[:running]):
        limits = ContainerLimits(
            (COMPUTE_MEM,),
            round(m.share_pct) if policy is Policy.FIXED else 0,
            "1GiB",
            "/",
            policy=int(policy),
            weight=m.weight,
            slot=m.slot,
            sched_dir=str(sched),
            gpus=(0,),
        )
        envs.append(container(s, b, i, COMPUTE_MEM, limits=limits))
    return envs


def policy_cases() -> list[tuple[Policy, list[Member], int]]:
    """The cases of ``benchmarks/cgpu_policies.py``: three containers, policy 4 with one running."""

    def three(
        pcts: tuple[float, ...] = (0, 0, 0), weights: tuple[int, ...] = (1, 1, 1)
    ) -> list[Member]:
        return [Member(f"c{i}", pcts[i], weights[i]) for i in range(3)]

    return [
        (Policy.EVEN, three(), 3),
        (Policy.PREEMPTIVE, three(), 3),
        (Policy.WEIGHTED, three(weights=(1, 2, 3)), 3),
        (Policy.FIXED, three((10, 20, 40)), 3),
        (Policy.SOFT, three(), 1),
    ]


def policies(
    s: Setting,
    rec: Recorder,
    b: BrokerProcess,
    work: Workload,
    policy: Policy,
    members: list[Member],
    running: int,
) -> None:
    """One policy's schedule (every member active), the first ``running`` containers flat out."""
    envs = scheduled(s, b, policy, members, running)
    plan = schedule(policy, members, max_pods=MAX_PODS, epoch_ns=0)
    open_pct = 100 * plan.share_of(OPEN) / running
    targets = [100 * plan.share_of(m.slot) + open_pct for m in members[:running]]
    got = work.run(envs)
    each = [summary(g, t, work.window, n) for g, t, n in zip(got, targets, work.nvml, strict=True)]
    probe = f"policy_{int(policy)}_{policy.name.lower()}"
    rec.figure(
        probe,
        {
            "running": running,
            "processes": each,
            "seconds": work.seconds,
            "sm_clock_mhz": work.clock,
        },
    )
    rec.check(f"{probe}: within {TOLERANCE_PTS:g} points", held(each))


# ------------------------------------------------------------------ 5. NVML as the plugin reads it


def nvml(s: Setting, rec: Recorder) -> None:
    """What the device plugin's NVML reader sees, beside nvidia-smi."""
    try:
        import pynvml

        rec.figure("pynvml", {"file": str(pynvml.__file__)})
        from gpushare.node.gpus import NvmlGpus

        source = NvmlGpus()
    except Exception as err:
        why = f"the plugin's NVML reader cannot start here: {type(err).__name__}: {err}"
        figures.finish(s.figures, "nvml", "skipped", 0, why)
        raise SystemExit(0) from err
    gpus = source.gpus()
    rec.figure(
        "gpus",
        {"gpus": [g.__dict__ for g in gpus], "topology": [list(r) for r in source.topology()]},
    )
    rec.figure("health_events", xid_events(pynvml))
    if shutil.which("nvidia-smi") is None:
        rec.skip("nvidia_smi", "nvidia-smi not on PATH")
        return
    q = subprocess.run(
        ["nvidia-smi", "--query-gpu=index,uuid,name,memory.total", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    rows = [[c.strip() for c in line.split(",")] for line in q.strip().splitlines()]
    topo = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=60)
    rec.figure("nvidia_smi", {"gpus": rows, "topo_m": topo.stdout[-3000:] or topo.stderr[-600:]})
    rec.check(
        "nvml: UUIDs as nvidia-smi lists them", [g.uuid for g in gpus] == [r[1] for r in rows]
    )
    rec.check(
        "nvml: models as nvidia-smi names them", [g.model for g in gpus] == [r[2] for r in rows]
    )
    rec.check(
        "nvml: memory as nvidia-smi reports it",
        [str(g.memory_mib) for g in gpus] == [r[3] for r in rows],
    )


def xid_events(pynvml: Any) -> dict[str, Any]:
    """Whether XID events can be registered (the plugin's health watch) and what a wait says."""
    try:
        events = pynvml.nvmlEventSetCreate()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, events)
    except pynvml.NVMLError as err:
        return {"registered": False, "error": str(err)}
    try:
        data = pynvml.nvmlEventSetWait(events, 500)
        waited = f"event {data.eventType} xid {data.eventData}"
    except pynvml.NVMLError as err:
        waited = f"no event in 500 ms ({err})"
    return {"registered": True, "wait": waited}


# ------------------------------------------------------------------ 6. MPS


def mps(s: Setting, rec: Recorder) -> None:
    """The plugin's MPS hook starts the daemon; a client with the env it injects; the limit."""
    from gpushare.core.model.inventory import Mode
    from gpushare.core.model.units import MemoryUnit
    from gpushare.core.records.handoff import MEM, Pending, Signature
    from gpushare.node.enforcement.hook import ContainerAnswer, Target
    from gpushare.node.enforcement.mps import MpsIsolation
    from gpushare.node.enforcement.mpsdaemon import MpsControl
    from gpushare.node.gpus import FakeGpus, GpuInfo, GpuSource, NvmlGpus

    source: GpuSource
    source = FakeGpus([GpuInfo(0, "GPU-fake-0", "fake", 16384)]) if s.rehearsal else NvmlGpus()
    runner = MpsControl()
    hook = MpsIsolation(
        runner=runner, state_dir=s.work / "state", source=source, unit=MemoryUnit.GiB
    )
    if missing := hook.prepare(Mode.MPS):
        figures.finish(s.figures, "mps", "skipped", 0, missing)
        raise SystemExit(0)
    signature = Signature(MEM, 2, ((0, 2),), 2, ((0, 30),))
    target = Target(
        signature, Mode.MPS, (Pending("uid-mps", "default/mps", "c0", signature),), ("dev-mps",)
    )
    try:
        t = time.monotonic()
        answer = hook.extend(ContainerAnswer(envs={}), target)
        pipe = Path(answer.mounts[-1][1])
        rec.figure(
            "daemon",
            {
                "started_s": round(time.monotonic() - t, 2),
                "envs": dict(answer.envs),
                "alive": runner.alive(pipe),
            },
        )
        rec.check("mps: the daemon answers", runner.alive(pipe))
        env = {**s.base_env(), **answer.envs, "CUDA_MPS_PIPE_DIRECTORY": str(pipe)}
        if s.rehearsal:
            rec.skip("client", "rehearsal: the stand-in daemon serves no clients")
        elif missing := modules_missing(["torch"]):
            rec.skip("client", missing)
        else:
            r = figure(
                rec,
                "client",
                run_child(s, env, "torch_fill", "64", str(2 * LIMIT // MiB), timeout=45),
            )
            filled = int(r.get("filled", 0))
            rec.check("mps: the client fills at most its 2 GiB", 0 < filled <= LIMIT)
            rec.check("mps: the client gets most of its 2 GiB", filled >= LIMIT - 512 * MiB)
    finally:
        hook.close()
    rec.figure("stopped", {"alive_after_close": runner.alive(pipe)})
    mps_without_host_pid(s, rec)


UNSHARE = (
    ("unshare", "--pid", "--fork", "--kill-child", "--mount-proc"),
    ("unshare", "--user", "--map-root-user", "--pid", "--fork", "--kill-child", "--mount-proc"),
)
"""A PID namespace as root, else inside a user namespace (CI runs as any user)."""


def mps_without_host_pid(s: Setting, rec: Recorder) -> None:
    """The daemon started from a PID namespace of its own (``mpsns.py``), its clients outside:
    the plugin with ``hostPID`` off. On a GPU a client's pinned-memory limit (it fills 64 MiB
    tensors up to twice its 2 GiB) and thread percentage (its SM count beside a plain
    process's) are checked; in rehearsal the stand-in daemon's start and stop."""
    if shutil.which("unshare") is None:
        rec.skip("no_host_pid", "unshare not on PATH")
        return
    plain_sms = None
    if not s.rehearsal and not modules_missing(["torch"]):
        r = run_child(s, s.base_env(), "torch_fill", "64", "64", timeout=45).result
        plain_sms = r.get("multi_processors")
    tried = []
    for cmd in UNSHARE:
        proc = subprocess.Popen(
            [
                *cmd,
                s.python,
                "-m",
                "tests.gpu.probes.mpsns",
                str(s.work),
                "1" if s.rehearsal else "0",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**s.base_env(), "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
        )
        assert proc.stdout is not None and proc.stdin is not None
        started = last_json(proc.stdout.readline())
        if "envs" in started:
            break
        _, err = proc.communicate(timeout=30)
        tried.append(f"{' '.join(cmd)}: {started.get('error') or err.strip()[-300:]}")
    else:
        rec.skip("no_host_pid", "; ".join(tried))
        return
    value: dict[str, Any] = {"unshare": " ".join(cmd), "tried_first": tried, **started}
    try:
        rec.check("mps without hostPID: the daemon answers", bool(started["alive"]))
        if s.rehearsal:
            rec.skip("no_host_pid_client", "rehearsal: the stand-in daemon serves no clients")
        elif missing := modules_missing(["torch"]):
            rec.skip("no_host_pid_client", missing)
        else:
            env = {**s.base_env(), **started["envs"], "CUDA_MPS_PIPE_DIRECTORY": started["pipe"]}
            out = run_child(s, env, "torch_fill", "64", str(2 * LIMIT // MiB), timeout=45)
            client = figure(rec, "no_host_pid_client", out, plain_multi_processors=plain_sms)
            filled = int(client.get("filled", 0))
            rec.check(
                "mps without hostPID: the client fills at most its 2 GiB", 0 < filled <= LIMIT
            )
            sms = client.get("multi_processors")
            if plain_sms and sms:
                value["thread_pct"] = round(100 * sms / plain_sms, 1)
                rec.check(
                    "mps without hostPID: the client's SMs are 30 ± 5 % of the GPU's",
                    abs(value["thread_pct"] - 30) <= TOLERANCE_PTS,
                )
    finally:
        out_rest, _ = proc.communicate("", timeout=30)
        value["stopped"] = last_json(out_rest)
        rec.figure("no_host_pid", value)


# ------------------------------------------------------------------ 7. use beside allocation


def use(s: Setting, rec: Recorder) -> None:
    """A container's use as the device plugin exports it, beside what NVML says of its process.

    A process holds 1.5 GiB of a 2 GiB container. The broker's count is what
    ``gpushare_container_gpu_memory_used_bytes`` reports (``NodeIsolation.usage``); the series
    is built by the plugin's own collector over the plugin's NVML reader, so its ``UUID`` label
    is the one dcgm-exporter and nvidia-smi give the GPU the process runs on.
    """
    from gpushare.deviceplugin.config import Stats
    from gpushare.deviceplugin.metrics import DevicePluginCollector
    from gpushare.kube.watchhealth import WatchHealth
    from gpushare.node.gpus import FakeGpus, GpuInfo, GpuSource, NvmlGpus
    from gpushare.node.usage import ContainerUse, Owner

    source: GpuSource
    source = FakeGpus([GpuInfo(0, "GPU-fake-0", "fake", 16384)]) if s.rehearsal else NvmlGpus()
    via = "driver" if modules_missing(["torch"]) else "torch"
    with broker(s) as b:
        env = container(s, b, 0, LIMIT)
        holder, held = hold(s, env, via)
        try:
            counted = b.usage("c0")
            process = nvml_process(holder.pid)
        finally:
            holder.kill()
            holder.wait(30)
    owner = Owner(pod="tenant-a/trainer", container="c0", gpus=(0,))
    uses = [ContainerUse(owner, (counted,), (LIMIT,))]

    plugin = _Scraped(Stats(), source, WatchHealth(role="device-plugin"))
    series = {
        family.name: [(sample.labels, sample.value) for sample in family.samples]
        for family in DevicePluginCollector(plugin, "gpu-node", lambda: uses).collect()
    }
    used = series.get("gpushare_container_gpu_memory_used_bytes", [])
    labels, value = used[0] if used else ({}, -1.0)
    rec.figure(
        "use",
        {
            "via": via,
            "held": held,
            "broker_counted": counted,
            "series_labels": labels,
            "series_value": value,
            "nvml_process": process,
            "gpu_uuids": [g.uuid for g in source.gpus()],
        },
    )
    rec.check("use: the series reports what the broker counts", value == counted)
    rec.check("use: the broker counts the 1.5 GiB held", HOLD <= counted <= LIMIT)
    if process.get("uuid"):
        rec.check(
            "use: the series' UUID is the process's GPU", labels.get("UUID") == process["uuid"]
        )
        nvml_used = int(process.get("used_bytes") or 0)
        rec.check(
            "use: NVML's figure for the process is the series' plus at most 1 GiB of context",
            value <= nvml_used <= value + GiB,
        )
    else:
        rec.skip("use_nvml", process.get("why", "NVML lists no process here"))


@dataclasses.dataclass(frozen=True)
class _Scraped:
    """What the plugin's collector reads of the plugin: its counters, its GPU reader and the
    health of its watches."""

    stats: Any
    source: Any
    health: Any


def nvml_process(pid: int) -> dict[str, Any]:
    """The GPU (UUID) and memory NVML lists for ``pid`` among compute processes."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as err:
        return {"why": f"NVML: {type(err).__name__}: {err}"}
    try:
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if p.pid == pid:
                    uuid = pynvml.nvmlDeviceGetUUID(handle)
                    return {"index": index, "uuid": uuid, "used_bytes": p.usedGpuMemory}
        return {
            "why": f"NVML lists no compute process {pid} (in a container of its own PID space?)"
        }
    except pynvml.NVMLError as err:
        return {"why": f"NVML: {err}"}
    finally:
        pynvml.nvmlShutdown()


def node(s: Setting, rec: Recorder) -> None:
    """The device plugin on this machine's NVML before a kubelet double (``node.py``)."""
    from .node import node as node_path

    node_path(s, rec)


STEPS: dict[str, Callable[[Setting, Recorder], None]] = {
    "node": node,
    "workloads": loads.workloads,
    "overhead": loads.overhead,
    "kernels": loads.kernels,
    "mps": mps,
    "memory": memory,
    "allocators": allocators,
    "compute": compute,
    "nvml": nvml,
    "use": use,
}


def main(step: str) -> int:
    s = from_env()
    t = time.monotonic()
    try:
        STEPS[step](s, Recorder(s.figures, step))
    except Exception as err:
        traceback.print_exc()
        why = f"{type(err).__name__}: {err}"[:400]
        figures.finish(s.figures, step, "failed", time.monotonic() - t, why)
        return 1
    figures.finish(s.figures, step, "ok", time.monotonic() - t)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
