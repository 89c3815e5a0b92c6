"""The device plugin's cGPU side, in-process, for interposers launching on fake GPUs.

:class:`FakeNode` runs the plugin's real ``InterposerIsolation`` (its broker, its schedules) on
an event loop in a thread and admits containers through ``extend``, as Allocate does. Each
container's interposer is a copy built to read its own limits file (the compiled-in path cannot
be /etc here); the test writes there the plugin's limits file with the host paths of the broker
socket and the schedule directory in place of the container ones. Processes launch with
``harness/fakegpu/programs/launches.c``; every host GPU is one fake SM, a ``FAKE_GPU_STATE``
file shared by the processes that launch on it.

:func:`timeline` reads a fake SM's kernel ring back, so a test can see each process's share
per window of time: how fast a schedule holds after a process starts or stops, and how steady.
"""

from __future__ import annotations

import asyncio
import os
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from gpushare.core.model.inventory import Mode
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.handoff import MEM, Pending, Signature
from gpushare.isolation import build
from gpushare.isolation.limits import ContainerLimits
from gpushare.isolation.policy import Policy
from gpushare.node.enforcement.broker import SOCKET_NAME
from gpushare.node.enforcement.hook import ContainerAnswer, Target
from gpushare.node.enforcement.interposer import SCHED, InterposerIsolation

T = TypeVar("T")
RING = 65536


@dataclass
class Container:
    """One admitted container: its account key, its interposer and its limits."""

    key: str
    lib: Path
    limits: ContainerLimits


@dataclass
class FakeNode:
    """The plugin's isolation hook on its own event loop, and the containers it admitted."""

    root: Path
    policy: Policy
    max_pods: int
    hook: InterposerIsolation = field(init=False)
    loop: asyncio.AbstractEventLoop = field(init=False)
    containers: dict[str, Container] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.hook = InterposerIsolation(
            lib_dir=self.root / "lib",
            state_dir=self.root / "state",
            unit=MemoryUnit.GiB,
            cgpu_policy=self.policy,
            max_pods=self.max_pods,
        )

    def call(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Run a coroutine on the node's loop and wait for it."""
        return asyncio.run_coroutine_threadsafe(make(), self.loop).result(30)

    def admit(
        self,
        name: str,
        lib: Path,
        limits_path: Path,
        *,
        gpus: tuple[int, ...] = (0,),
        weight: int = 1,
        core_pct: int = 0,
    ) -> Container:
        """Allocate a container of 1 GiB per GPU, as kubelet's Allocate would."""
        signature = Signature(
            MEM,
            len(gpus),
            tuple((g, 1) for g in gpus),
            len(gpus),
            tuple((g, core_pct) for g in gpus) if core_pct else (),
        )
        pending = Pending(f"uid-{name}", f"default/{name}", "c0", signature)
        target = Target(signature, Mode.CGPU, (pending,), (f"dev-{name}",), weight=weight)

        async def extend() -> None:
            self.hook.extend(ContainerAnswer(envs={}), target)

        self.call(extend)
        key = f"uid-{name}/c0"
        written = ContainerLimits.parse(
            (self.root / "state" / "limits" / key / "limits").read_text()
        )
        # the host paths where the container would see its mounts
        here = replace(
            written,
            broker=str(self.root / "state" / "broker" / key / SOCKET_NAME),
            sched_dir=str(self.root / "state" / SCHED),
        )
        limits_path.write_text(here.render())
        container = Container(key, lib, here)
        self.containers[name] = container
        return container

    def schedule(self, gpu: int) -> str:
        return (self.root / "state" / SCHED / f"gpu{gpu}").read_text()

    def close(self) -> None:
        """Stop serving the accounts, let the closed connections go, close the loop."""

        async def close() -> None:
            self.hook.close()
            for _ in range(5):
                await asyncio.sleep(0.01)
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self.call(close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def interposers(out: Path, count: int) -> list[tuple[Path, Path]]:
    """``count`` interposer copies, each reading its own limits file: (library, limits path)."""
    made = []
    for i in range(count):
        limits = out / f"c{i}" / "limits"
        limits.parent.mkdir(parents=True, exist_ok=True)
        made.append((build.build(out / f"c{i}" / build.LIB_NAME, limits_file=str(limits)), limits))
    return made


@dataclass(frozen=True)
class Launch:
    """One launcher process: which container, which device ordinal, when, for how long."""

    container: str
    device: int = 0
    start_s: float = 0.0
    seconds: float = 3.0


def run_launches(
    launches_bin: Path,
    node: FakeNode,
    env: dict[str, str],
    state_of: Callable[[Container, int], Path],
    plan: list[Launch],
) -> tuple[int, dict[int, Launch], list[str]]:
    """Start each launcher at its time; the start (monotonic ns), pids and outputs."""
    t0 = time.monotonic_ns()
    procs: dict[int, tuple[subprocess.Popen[str], Launch]] = {}
    for launch in sorted(plan, key=lambda x: x.start_s):
        delay = t0 + int(launch.start_s * 1e9) - time.monotonic_ns()
        if delay > 0:
            time.sleep(delay / 1e9)
        c = node.containers[launch.container]
        proc = subprocess.Popen(
            [str(launches_bin), str(launch.seconds), str(launch.device)],
            env={
                **env,
                "LD_PRELOAD": str(c.lib),
                "FAKE_GPU_STATE": str(state_of(c, launch.device)),
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs[proc.pid] = (proc, launch)
    outs = []
    for proc, _ in procs.values():
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "gpushare:" not in err, err
        outs.append(out)
    return t0, {pid: launch for pid, (_, launch) in procs.items()}, outs


def timeline(
    state: Path, pids: list[int], t0: int, until_s: float, window_s: float = 0.1
) -> list[dict[int, float]]:
    """Each pid's share (%) of the fake SM per window from ``t0`` (the kernel ring, read back)."""
    data = state.read_bytes()
    ring_n = struct.unpack_from("<Q", data, 8)[0]
    starts = struct.unpack_from(f"<{RING}Q", data, 16)
    ends = struct.unpack_from(f"<{RING}Q", data, 16 + 8 * RING)
    owners = struct.unpack_from(f"<{RING}i", data, 16 + 16 * RING)
    window = int(window_s * 1e9)
    count = int(until_s / window_s)
    busy = [dict.fromkeys(pids, 0) for _ in range(count)]
    for j in range(min(ring_n, RING)):
        pid = owners[j]
        if pid not in pids:
            continue
        s, e = starts[j] - t0, ends[j] - t0
        first, last = max(0, s // window), min(count - 1, (e - 1) // window)
        for w in range(first, last + 1):
            lo, hi = max(s, w * window), min(e, (w + 1) * window)
            if hi > lo:
                busy[w][pid] += hi - lo
    return [{pid: 100 * b / window for pid, b in row.items()} for row in busy]


def shared_env(built_cuda: Path, built_nvml: Path) -> dict[str, str]:
    """The launchers' environment: no GPUSHARE_* of the test's, the fake libraries."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSHARE_")}
    env.update(GPUSHARE_REAL_CUDA=str(built_cuda), GPUSHARE_REAL_NVML=str(built_nvml))
    return env
