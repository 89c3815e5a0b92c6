"""Where the run's pieces live, and the containers the steps make out of them.

``run_on_gpu.sh`` exports the paths (``GPUSHARE_GPU_*``); :func:`from_env` reads them once.
A *container* here is what Allocate gives one: a copy of the interposer built to read its own
limits file (the compiled-in path is fixed per copy, so each container ``c<i>`` has a copy
reading ``<work>/c<i>/limits``), the limits file the plugin's renderer writes, and an account
in the broker. The same steps run in both modes: on a GPU the interposer forwards to the real
``libcuda.so.1`` and ``libnvidia-ml.so.1``; in rehearsal to the project's fake driver and NVML
(``harness/fakegpu/fakes``), named by ``GPUSHARE_REAL_CUDA`` / ``GPUSHARE_REAL_NVML``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpushare.isolation.build import LIB_NAME
from gpushare.isolation.limits import ContainerLimits

GiB = 2**30
MiB = 2**20
CONTAINERS = 4


@dataclass(frozen=True)
class Setting:
    """The run's mode and paths."""

    mode: str
    """``gpu`` or ``rehearsal``."""
    figures: Path
    work: Path
    """Scratch: limits files, broker sockets, schedules (``/tmp/gpushare-gpu`` by default)."""
    lib_dir: Path
    """``libgpushare-cuda.so`` (reads /etc/gpushare/limits) and ``c<i>/libgpushare-cuda.so``."""
    fake_dir: Path | None
    """Rehearsal: the fake driver, NVML and the ``launches`` program."""
    python: str

    @property
    def rehearsal(self) -> bool:
        return self.mode == "rehearsal"

    @property
    def interposer(self) -> Path:
        return self.lib_dir / LIB_NAME

    @property
    def cuda(self) -> str:
        """The driver the probes open with ctypes (through the preload, as any program)."""
        return str(self.fake_dir / "libfakecuda.so") if self.fake_dir else "libcuda.so.1"

    @property
    def nvml(self) -> str:
        return str(self.fake_dir / "libfakenvml.so") if self.fake_dir else "libnvidia-ml.so.1"

    def base_env(self) -> dict[str, str]:
        """This process's environment without any GPUSHARE_ setting or preload of its own."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSHARE_")}
        env.pop("LD_PRELOAD", None)
        env.update(PYTHONUNBUFFERED="1", GPUSHARE_GPU_CUDA=self.cuda, GPUSHARE_GPU_NVML=self.nvml)
        if self.fake_dir:
            env.update(
                GPUSHARE_REAL_CUDA=self.cuda,
                GPUSHARE_REAL_NVML=self.nvml,
                FAKE_GPU_STATE=str(self.work / "fake-gpu"),
            )
        return env

    def limits_path(self, index: int) -> Path:
        return self.work / f"c{index}" / "limits"


def from_env() -> Setting:
    """The setting ``run_on_gpu.sh`` exported; KeyError names a missing variable."""
    fake = os.environ.get("GPUSHARE_GPU_FAKE_DIR", "")
    return Setting(
        mode=os.environ["GPUSHARE_GPU_MODE"],
        figures=Path(os.environ["GPUSHARE_GPU_FIGURES"]),
        work=Path(os.environ["GPUSHARE_GPU_WORK"]),
        lib_dir=Path(os.environ["GPUSHARE_GPU_LIB_DIR"]),
        fake_dir=Path(fake) if fake else None,
        python=os.environ.get("GPUSHARE_GPU_PYTHON", sys.executable),
    )


class BrokerProcess:
    """``brokering.py`` in a child process: open accounts, read their usage."""

    def __init__(self, setting: Setting) -> None:
        self.root = setting.work / "broker"
        self.proc = subprocess.Popen(
            [setting.python, "-m", "tests.gpu.probes.brokering", str(self.root)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**setting.base_env(), "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
        )

    def ask(self, line: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline().strip()
        if not reply or reply.startswith("error"):
            raise RuntimeError(f"broker answered {reply!r} to {line!r}")
        return reply

    def open(self, key: str, limit_bytes: int | tuple[int, ...]) -> str:
        """A fresh account (one limit, or one per GPU); the socket's path."""
        each = limit_bytes if isinstance(limit_bytes, tuple) else (limit_bytes,)
        return self.ask(f"open {key} {','.join(str(b) for b in each)}").split(" ", 1)[1]

    def usage(self, key: str) -> int:
        return int(self.ask(f"usage {key}").split()[1].split(",")[0])

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()


@contextmanager
def broker(setting: Setting) -> Iterator[BrokerProcess]:
    """A broker for the duration of a step."""
    served = BrokerProcess(setting)
    try:
        yield served
    finally:
        served.close()


def container(
    setting: Setting,
    served: BrokerProcess,
    index: int,
    mem_limit: int,
    *,
    core_pct: int = 0,
    limits: ContainerLimits | None = None,
) -> dict[str, str]:
    """Admit container ``c<index>`` (a fresh account, its limits file); its processes' env."""
    socket = served.open(f"c{index}", limits.mem_limit_bytes if limits else mem_limit)
    if limits is None:
        written = ContainerLimits((mem_limit,), core_pct, "1GiB", socket)
    else:
        written = replace(limits, broker=socket)
    path = setting.limits_path(index)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(written.render())
    return {
        **setting.base_env(),
        "LD_PRELOAD": str(setting.lib_dir / f"c{index}" / LIB_NAME),
        "GPUSHARE_MEM_LIMIT": str(mem_limit),
    }


@dataclass(frozen=True)
class Outcome:
    """A child program's end: its JSON result (``{}`` if none), exit code and stderr's tail."""

    result: dict[str, Any]
    rc: int
    stderr: str
    seconds: float


def child_cmd(setting: Setting, probe: str, *args: str) -> list[str]:
    return [setting.python, "-m", "tests.gpu.probes.children", probe, *args]


def run_child(
    setting: Setting, env: dict[str, str], probe: str, *args: str, timeout: float = 120
) -> Outcome:
    """Run one child probe to its end; it prints one JSON object as its last line."""
    t = time.monotonic()
    try:
        done = subprocess.run(
            child_cmd(setting, probe, *args),
            env={**env, "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as err:
        tail = (err.stderr or b"")[-2000:]
        text = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
        return Outcome({}, 124, text, time.monotonic() - t)
    return Outcome(
        last_json(done.stdout), done.returncode, done.stderr[-2000:], time.monotonic() - t
    )


def last_json(stdout: str) -> dict[str, Any]:
    """The last line that is a JSON object, or ``{}``."""
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            try:
                value: dict[str, Any] = json.loads(line)
            except ValueError:
                continue
            return value
    return {}


def start_child(
    setting: Setting, env: dict[str, str], probe: str, *args: str
) -> subprocess.Popen[str]:
    """Start a child probe that runs alongside others (stdin and stdout piped)."""
    return subprocess.Popen(
        child_cmd(setting, probe, *args),
        env={**env, "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def modules_missing(names: Sequence[str]) -> str:
    """Why one of the Python modules can't be used here, or ""."""
    import importlib.util

    missing = [n for n in names if importlib.util.find_spec(n) is None]
    return f"{', '.join(missing)} not importable on this machine" if missing else ""
