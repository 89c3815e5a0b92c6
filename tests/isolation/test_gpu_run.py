"""The GPU run (``tests/gpu/run_on_gpu.sh``), rehearsed on the fake driver, so CI guards it.

Nobody can try the script on a GPU before the one lent call it is written for, so its plumbing
is proven here: the same steps against the fake driver and NVML, a stand-in MPS control daemon,
the accounting broker, and the figures file's shape. The timings on a shared CPU are not
checked; the memory figures, which are exact, are.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.gpu.probes import figures, loads, run, sampling, steps

ROOT = Path(__file__).resolve().parents[2]
STEPS = list(run.STEP_CAPS_S)

pytestmark = pytest.mark.skipif(
    shutil.which("gcc") is None or shutil.which("bash") is None,
    reason="gcc and bash are needed: the run builds the interposer and the fakes",
)


@pytest.fixture(scope="module")
def rehearsal() -> Iterator[tuple[subprocess.CompletedProcess[str], dict[str, Any], Path]]:
    """One quick rehearsal of every step; its exit, its figures and its output folder."""
    tmp = Path(tempfile.mkdtemp(prefix="gsgpu-", dir="/tmp"))  # short: socket paths
    out = tmp / "out"
    env = {
        **os.environ,
        "OUT": str(out),
        "GPUSHARE_GPU_REHEARSAL": "1",
        "GPUSHARE_GPU_QUICK": "1",
        "GPUSHARE_GPU_PYTHON": sys.executable,
        "GPUSHARE_GPU_WORK": str(tmp / "work"),
        "GPUSHARE_GPU_BUDGET_S": "240",
    }
    done = subprocess.run(
        ["bash", str(ROOT / "tests" / "gpu" / "run_on_gpu.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    print(done.stdout[-3000:])
    yield done, json.loads((out / "figures.json").read_text()), out
    shutil.rmtree(tmp, ignore_errors=True)


def test_every_step_runs_or_says_why_not(rehearsal: Any) -> None:
    done, data, out = rehearsal
    assert done.returncode == 0, done.stderr[-2000:]
    assert data["schema"] == figures.SCHEMA and data["mode"] == "rehearsal"
    assert list(data["steps"]) == STEPS  # in order of value
    for step, entry in data["steps"].items():
        assert entry["status"] in ("ok", "skipped"), (step, entry)
        assert entry["status"] == "ok" or entry["reason"], step
        assert set(entry) >= {"figures", "skipped", "checks", "seconds"}
    assert "| step | status |" in (out / "run.log").read_text()
    assert data["machine"]["interposer"].startswith("built here")


def test_the_memory_limit_holds_through_the_driver(rehearsal: Any) -> None:
    _, data, _ = rehearsal
    memory = data["steps"]["memory"]
    assert set(memory["figures"]) >= {"driver", "nvml", "two_processes", "sigkill"}
    assert memory["checks"] and all(memory["checks"].values()), memory["checks"]
    # by UUID, on the fake's two GPUs: the limit, a stranger refused, the order reversed
    assert {"uuid_limit", "uuid_stranger", "uuid_reversed"} <= set(memory["figures"])
    assert memory["checks"]["reversed: ordinal 0, the second GPU, has its own limit"]
    assert "none of this container's GPUs" in memory["figures"]["uuid_stranger"]["gpushare_said"][0]
    assert memory["figures"]["sigkill"]["usage_before"] == 3 * 2**29
    allocators = data["steps"]["allocators"]
    assert all(allocators["checks"].values()), allocators["checks"]
    assert {"vmm", "managed"} <= set(allocators["figures"])


def test_frameworks_missing_are_skipped_with_the_reason(rehearsal: Any) -> None:
    _, data, _ = rehearsal
    modules = data["machine"]["modules"]
    for module, step, probe in (
        ("torch", "memory", "torch_default"),
        ("torch", "memory", "torch_async"),
        ("cupy", "allocators", "cupy_default"),
        ("jax", "allocators", "jax"),
    ):
        if not modules[module]:
            assert module in data["steps"][step]["skipped"][probe]
    if not modules["torch"]:
        assert "torch" in data["steps"]["workloads"]["reason"]


def test_computing_power_figures_have_one_shape(rehearsal: Any) -> None:
    _, data, _ = rehearsal
    compute = data["steps"]["compute"]["figures"]
    expected = {
        *run_cases(),
        *(f"policy_{p}" for p in ("0_even", "1_preemptive", "2_weighted", "3_fixed", "4_soft")),
    }
    assert set(compute) == expected
    for probe, figure in compute.items():
        for process in figure["processes"]:
            assert set(process) == {
                "target_pct",
                "steady_pct",
                "off_pts",
                "settled_after_s",
                "nvml_sm_pct",
                "nvml_off_pts",
                "windows_pct",
            }, probe
            assert process["windows_pct"], probe


def run_cases() -> list[str]:
    from tests.gpu.probes.steps import CORE_CASES

    return list(CORE_CASES)


def test_the_mps_daemon_is_started_and_stopped_as_the_plugin_does(rehearsal: Any) -> None:
    _, data, _ = rehearsal
    step = data["steps"]["mps"]
    mps = step["figures"]
    assert mps["daemon"]["alive"] and not mps["stopped"]["alive_after_close"]
    assert mps["daemon"]["envs"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2048M"
    assert mps["daemon"]["envs"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    # from a PID namespace of its own (hostPID off), where this machine allows one
    if "no_host_pid" in mps:
        ns = mps["no_host_pid"]
        assert ns["alive"] and not ns["stopped"]["alive_after_close"], ns
        assert ns["envs"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    else:
        assert "unshare" in step["skipped"]["no_host_pid"]


def test_the_node_path_publishes_allocates_and_holds(rehearsal: Any) -> None:
    """The plugin on the fake NVML before the kubelet double; processes started with its
    answers, held to 2 GiB and to 30 %."""
    _, data, _ = rehearsal
    node = data["steps"]["node"]
    assert node["status"] == "ok", node
    assert node["checks"] and all(node["checks"].values()), node["checks"]
    fig = node["figures"]
    assert fig["published_cgpu"]["devices"]["aliyun.com/gpu-mem"]["count"] == 32  # 2 x 16 GiB
    assert fig["published_core_mem"]["devices"]["aliyun.com/gpu-core.percentage"]["count"] == 200
    assert fig["allocate_mem_2gib"]["envs"]["GPUSHARE_MEM_LIMIT"] == str(2 * 2**30)
    assert fig["allocate_core_30"]["envs"]["GPUSHARE_CORE_LIMIT"] == "30"
    assert fig["held_mem_2gib"]["total"] == 2 * 2**30
    assert "broker=/var/run/gpushare/broker.sock" in fig["held_mem_2gib"]["answer"]["limits_file"]
    assert abs(fig["held_core_30"]["process"]["off_pts"]) <= 5


def test_overhead_and_kernels_run_their_plumbing_on_the_fake_driver(rehearsal: Any) -> None:
    _, data, _ = rehearsal
    launches = data["steps"]["overhead"]["figures"]["launches"]
    assert launches["kind"] == "driver" and launches["warm_rounds_discarded"] == 2
    assert {"plain_again_pct", "preload_pct", "preload_limit_pct", "noise_pct"} <= set(launches)
    assert all(len(v) == launches["rounds"] for v in launches["seconds"].values())
    kernels = data["steps"]["kernels"]["figures"]
    assert set(kernels) == {f"kernel_{ms}ms" for ms in (1, 10, 50, 200)}
    assert all(k["process"]["windows_pct"] for k in kernels.values())
    if not data["machine"]["modules"]["torch"]:
        assert "torch" in data["steps"]["workloads"]["reason"]


def test_a_step_without_time_left_is_skipped_with_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {
        "GPUSHARE_GPU_MODE": "rehearsal",
        "GPUSHARE_GPU_FIGURES": str(tmp_path / "figures.json"),
        "GPUSHARE_GPU_WORK": str(tmp_path),
        "GPUSHARE_GPU_LIB_DIR": str(tmp_path),
        "GPUSHARE_GPU_BUDGET_S": "5",
        "GPUSHARE_GPU_STEPS": "nvml,mps",
    }.items():
        monkeypatch.setenv(name, value)
    assert run.main() == 0
    steps = json.loads((tmp_path / "figures.json").read_text())["steps"]
    assert list(steps) == ["mps", "nvml"]  # in the run's order, not the list's
    assert all(e["status"] == "skipped" and "budget" in e["reason"] for e in steps.values())


def test_the_figures_file_names_a_bad_status() -> None:
    with pytest.raises(ValueError, match="step status 'done' is not one of running, ok"):
        figures.finish(Path("/nonexistent"), "memory", "done", 0)


class StubNvml:
    """pynvml's names the sampler uses, answering as the H100 run did (pids, µs stamps)."""

    NVML_CLOCK_SM = 1

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.polls = 0

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"gpu{index}"

    def nvmlDeviceGetClockInfo(self, handle: str, kind: int) -> int:
        return 1755 if kind == self.NVML_CLOCK_SM else 0

    def nvmlDeviceGetProcessUtilization(self, handle: str, last_seen: int) -> list[Any]:
        self.polls += 1
        if self.polls % 2:  # NVML_ERROR_NOT_FOUND: nothing new since last_seen
            raise RuntimeError("Not Found")
        now = int(time.time() * 1e6)
        sample = types.SimpleNamespace(pid=self.pid, timeStamp=now, smUtil=30 + self.polls % 4)
        return [sample] if now > last_seen else []


def test_the_sampler_reads_each_process_time_share_and_the_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The GPU-only path of the compute step, on a stub of pynvml (the rehearsal has none)."""
    stub = StubNvml(pid=4242)
    monkeypatch.setitem(sys.modules, "pynvml", stub)
    start = time.time()
    with sampling.NvmlSampler() as sampler:
        time.sleep(12 * sampling.POLL_S)
    end = time.time()
    assert sampler.problem == ""
    share = sampler.sm_pct(4242, start, end)
    assert share is not None and 30 <= share <= 33
    assert sampler.sm_pct(1, start, end) is None  # another pid's samples are not counted
    assert sampler.clock_mhz(start, end) == 1755
    assert sampler.sm_pct(4242, end + 1, end + 2) is None


def test_without_nvml_the_sampler_says_why_and_the_rate_is_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    with sampling.NvmlSampler() as sampler:
        pass
    assert "NVML cannot be read here" in sampler.problem
    near = steps.summary([31.0] * 8, 30, 0.25)
    assert near["nvml_sm_pct"] is None and steps.held([near])
    # with NVML's time share of a process alone, that share is what counts
    assert not steps.held([steps.summary([31.0] * 8, 30, 0.25, nvml_pct=40.0)])
    assert steps.held([steps.summary([37.0] * 8, 30, 0.25, nvml_pct=31.0)])
    # several processes: NVML put them all on one pid (the H100 run), so the rates count
    pair = [
        steps.summary([31.0] * 8, 30, 0.25, nvml_pct=None),
        steps.summary([61.0] * 8, 60, 0.25, nvml_pct=87.1),
    ]
    assert steps.held(pair)


def test_overhead_is_the_median_of_per_round_ratios_after_the_warm_up() -> None:
    """A slow round slows every variant in it and so cancels out; a slow warm-up is left out."""
    drift = [2.0, 1.5, 1.0, 1.3, 0.9, 1.1, 1.0]  # the machine's state, round by round
    times = {
        "plain": [d * 0.40 for d in drift],
        "plain_again": [d * 0.40 * (1.004 if i % 2 else 0.998) for i, d in enumerate(drift)],
        "preload": [d * 0.41 for d in drift],
        "preload_limit": [d * 0.40 * (5.0 if i == 0 else 1.02) for i, d in enumerate(drift)],
    }
    got = loads.paired(times, warm=1)
    assert got["preload_pct"] == 2.5
    assert got["preload_limit_pct"] == 2.0  # the first round's 5x was warm-up
    assert got["noise_pct"] < 1 and got["plain_again_iqr_pts"] < 1
    assert len(got["seconds"]["plain"]) == len(drift) - 1


SYNCED_AMP = (
    "import json, sys; print(json.dumps({'ready': True}), flush=True); sys.stdin.readline(); "
    "print(json.dumps({'checksum': 1.5, 'per_s': 26.0}))"
)
"""A stand-in for ``torch_workload amp 3 sync``: warm, waits for the go, a quarter of the rate."""


def test_the_gpu_branches_of_workloads_and_kernels_read_their_children(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The steps' GPU half, which no rehearsal reaches (it needs PyTorch and a GPU), on children
    that answer as the GPU's would: what is asked of them and what is checked of their answers."""
    monkeypatch.setenv("PYTHONPATH", f"{ROOT / 'src'}:{ROOT}")
    monkeypatch.delenv("GPUSHARE_GPU_QUICK", raising=False)
    s = steps.Setting("gpu", tmp_path / "figures.json", tmp_path, tmp_path / "lib", None, "python3")
    s = dataclasses.replace(s, python=sys.executable)
    figures.start(s.figures, "gpu", {})
    asked: list[tuple[str, ...]] = []

    def child(setting: Any, env: dict[str, str], probe: str, *args: str, **_: Any) -> Any:
        asked.append((probe, *args))
        limited = "GPUSHARE_CORE_LIMIT" in env
        if probe == "torch_workload":
            result = {"checksum": 1.5, "per_s": 50.0 if limited else 100.0}
            if args[0] == "expandable" and limited:
                result |= {"reserved_at_oom": 8 * 2**30 - 2**20, "total": 8 * 2**30}
        elif args[:2] == ("1", "0.2"):  # the unlimited calibration
            result = {"cycles_per_ms": 1_980_000}
        else:
            result = {"ms": float(args[0]), "share_pct": 31.0, "second_half_wall": [0, 1]}
        return setting_outcome(result)

    def start(setting: Any, env: dict[str, str], probe: str, *args: str) -> Any:
        asked.append((probe, *args))
        return subprocess.Popen(
            [sys.executable, "-c", SYNCED_AMP],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    monkeypatch.setattr(loads, "modules_missing", lambda names: "")
    monkeypatch.setattr(loads, "run_child", child)
    monkeypatch.setattr(loads, "start_child", start)
    for step in ("workloads", "kernels"):
        figures.begin(s.figures, step)
        steps.STEPS[step](s, figures.Recorder(s.figures, step))
    data = json.loads(s.figures.read_text())["steps"]
    work = data["workloads"]
    assert set(work["figures"]) == {*loads.WORKLOADS, "two_processes_one_container"}
    assert work["checks"] and all(work["checks"].values()), work["checks"]
    assert work["figures"]["two_processes_one_container"]["sum_share_pct"] == 52.0
    assert ("torch_workload", "amp", "3", "sync") in asked
    kern = data["kernels"]
    assert kern["checks"] and all(kern["checks"].values()), kern["checks"]
    assert ("spin", "200", "3", "1980000") in asked  # the calibrated cycles, passed on


def setting_outcome(result: dict[str, Any]) -> Any:
    from tests.gpu.probes.setting import Outcome

    return Outcome(result, 0, "", 0.1)
