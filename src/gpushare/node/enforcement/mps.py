"""mps: each container pointed at its GPU's MPS control daemon, with MPS's pinned-memory limit."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import replace
from pathlib import Path

from gpushare.core.admitting.isolationpaths import CONTAINER_MPS_PIPE_DIR
from gpushare.core.model.inventory import Mode
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.handoff import MEM
from gpushare.node.enforcement.hook import (
    ContainerAnswer,
    IsolationError,
    Target,
)
from gpushare.node.enforcement.mpsdaemon import DaemonRunner
from gpushare.node.gpus import GpuInfo, GpuSource

log = logging.getLogger(__name__)


class MpsIsolation:
    """mps: one control daemon per GPU, started lazily, restarted when dead, stopped at the end."""

    def __init__(
        self, *, runner: DaemonRunner, state_dir: Path, source: GpuSource, unit: MemoryUnit
    ) -> None:
        self.runner = runner
        self.state_dir = state_dir
        self.source = source
        self.unit = unit
        self.started: dict[str, Path] = {}

    def prepare(self, mode: Mode) -> str | None:
        """Refuse to start when MPS cannot run."""
        return self.runner.missing()

    def pipe_dir(self, gpu: GpuInfo) -> Path:
        """The GPU's pipe directory on the host."""
        return self.state_dir / "mps" / gpu.uuid / "pipe"

    def ensure(self, gpu: GpuInfo) -> Path:
        """Start the GPU's daemon unless it answers; return its pipe directory."""
        pipe = self.pipe_dir(gpu)
        if gpu.uuid in self.started and self.runner.alive(pipe):
            return pipe
        logs = pipe.parent / "log"
        try:
            pipe.mkdir(parents=True, exist_ok=True)
            logs.mkdir(parents=True, exist_ok=True)
            self.runner.start(gpu, pipe, logs)
        except OSError as err:
            raise IsolationError(
                f"cannot start the MPS control daemon for GPU {gpu.index}: {err}"
            ) from err
        verb = "restarted" if gpu.uuid in self.started else "started"
        self.started[gpu.uuid] = pipe
        log.info("gpu=%d uuid=%s pipe=%s phase=mps %s", gpu.index, gpu.uuid, pipe, verb)
        return pipe

    def extend(self, answer: ContainerAnswer, target: Target) -> ContainerAnswer:
        """Point the container at its GPU's daemon, with its pinned-memory limit."""
        signature = target.signature
        if signature.resource != MEM:
            return answer
        if len(signature.layout) != 1:
            raise IsolationError(
                f"mps nodes serve one GPU a container, this one got {len(signature.layout)}"
            )
        index, units = signature.layout[0]
        gpu = next((g for g in self.source.gpus() if g.index == index), None)
        if gpu is None:
            raise IsolationError(f"GPU {index} is not on this node any more")
        pipe = self.ensure(gpu)
        envs = {
            **answer.envs,
            "CUDA_MPS_PIPE_DIRECTORY": CONTAINER_MPS_PIPE_DIR,
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={units * self.unit.mib}M",
        }
        if signature.core_layout:
            envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(signature.core_layout[0][1])
        mounts = (*answer.mounts, (CONTAINER_MPS_PIPE_DIR, str(pipe), False))
        return replace(answer, envs=envs, mounts=mounts)

    def prune(self, live_uids: frozenset[str], live_devices: frozenset[tuple[str, ...]]) -> None:
        """Nothing per container: the daemons live as long as the plugin."""

    def weigh(self, uid: str, container: str, device_ids: tuple[str, ...], weight: int) -> None:
        """No schedules on mps nodes."""

    def close(self) -> None:
        """Stop every daemon this hook started."""
        for pipe in self.started.values():
            with contextlib.suppress(OSError):
                self.runner.stop(pipe)
        self.started.clear()
