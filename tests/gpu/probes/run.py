"""Run the steps in order of value, each in its own process group with its own timeout.

``python -m tests.gpu.probes.run`` (``run_on_gpu.sh`` calls it with the setting exported).
``GPUSHARE_GPU_BUDGET_S`` (default 420) is the whole run's time: a step gets at most its own cap
and never more than what is left, and a step that would start with under ``MIN_STEP_S`` left is
recorded as skipped. ``GPUSHARE_GPU_STEPS`` (comma-separated) runs only those steps. A step
killed at its timeout takes its children with it (they share its process group) and is recorded
``timeout``; one that exits without closing its entry is ``failed``. The figures it recorded
before stay. At the end, every goal checked is printed as a short table, for the reply's tail.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from importlib import metadata
from typing import Any

from . import figures
from .setting import Setting, from_env

STEP_CAPS_S = {
    "node": 60,
    "workloads": 180,
    "overhead": 50,
    "kernels": 60,
    "mps": 50,
    "memory": 90,
    "allocators": 80,
    "compute": 170,
    "nvml": 30,
    "use": 30,
}
"""Each step's own timeout, in the order they run (most valuable first)."""
MIN_STEP_S = 15


def version(name: str) -> str | None:
    """A distribution's version, or None where it is missing."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def machine(s: Setting) -> dict[str, Any]:
    """What the run found: Python, the frameworks, the tools, the GPU."""
    found: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "interposer": os.environ.get("GPUSHARE_GPU_INTERPOSER_FROM", ""),
        "lib_dir": str(s.lib_dir),
        "modules": {
            m: importlib.util.find_spec(m) is not None
            for m in ("torch", "cupy", "jax", "pynvml", "msgspec")
        },
        "versions": {
            d: version(d)
            for d in ("torch", "cupy-cuda13x", "cupy-cuda12x", "jax", "nvidia-ml-py", "msgspec")
        },
        "tools": {t: shutil.which(t) for t in ("gcc", "nvidia-smi", "nvidia-cuda-mps-control")},
    }
    spec = importlib.util.find_spec("pynvml")
    found["pynvml_file"] = spec.origin if spec else None
    if shutil.which("nvidia-smi"):
        done = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=name,memory.total,driver_version,compute_mode",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        found["gpus"] = done.stdout.strip().splitlines() or done.stderr.strip()[-300:]
    return found


def run_step(s: Setting, step: str, timeout: float) -> None:
    """One step in its own session, killed with its children at the timeout."""
    figures.begin(s.figures, step)
    t = time.monotonic()
    print(f"=== step {step} (timeout {timeout:.0f} s)", flush=True)
    proc = subprocess.Popen(
        [s.python, "-m", "tests.gpu.probes.steps", step], start_new_session=True
    )
    try:
        rc = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        figures.finish(
            s.figures, step, "timeout", time.monotonic() - t, f"killed after {timeout:.0f} s"
        )
        return
    status = json.loads(s.figures.read_text())["steps"][step]["status"]
    if status == "running":
        figures.finish(
            s.figures, step, "failed", time.monotonic() - t, f"exit code {rc}: see the log"
        )


def report(s: Setting) -> int:
    """Print each step's status and each goal; the number of goals not met."""
    data = json.loads(s.figures.read_text())
    missed = 0
    print("\n| step | status | s | goals met | not met |\n| --- | --- | --- | --- | --- |")
    for step, entry in data["steps"].items():
        checks = entry.get("checks", {})
        bad = [goal for goal, met in checks.items() if not met]
        missed += len(bad)
        why = f" ({entry['reason']})" if entry.get("reason") else ""
        print(
            f"| {step} | {entry['status']}{why} | {entry.get('seconds', '')} | "
            f"{len(checks) - len(bad)} | {'; '.join(bad)} |"
        )
        for probe, reason in entry.get("skipped", {}).items():
            print(f"|   {probe} | skipped: {reason} | | | |")
    return missed


def main() -> int:
    s = from_env()
    budget = float(os.environ.get("GPUSHARE_GPU_BUDGET_S", "420"))
    wanted = [w for w in os.environ.get("GPUSHARE_GPU_STEPS", "").split(",") if w]
    unknown = [w for w in wanted if w not in STEP_CAPS_S]
    if unknown:
        print(f"GPUSHARE_GPU_STEPS names {unknown}: the steps are {', '.join(STEP_CAPS_S)}")
        return 2
    start = time.monotonic()
    figures.start(s.figures, s.mode, machine(s))
    for step, cap in STEP_CAPS_S.items():
        if wanted and step not in wanted:
            continue
        left = budget - (time.monotonic() - start)
        if left < MIN_STEP_S:
            figures.finish(s.figures, step, "skipped", 0, f"the run's budget had {left:.0f} s left")
            continue
        run_step(s, step, min(cap, left - 2))
    missed = report(s)
    print(f"\nfigures: {s.figures}; goals not met: {missed}; {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
