"""The MPS control daemon, one per GPU: started, probed, stopped (nvidia-cuda-mps-control)."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path
from typing import Protocol

from gpushare.node.gpus import GpuInfo

log = logging.getLogger(__name__)


class DaemonRunner(Protocol):
    """Starts, probes and stops one MPS control daemon, named by its pipe directory."""

    def missing(self) -> str | None:
        """Why no daemon can be run on this node; None when one can."""
        ...

    def start(self, gpu: GpuInfo, pipe_dir: Path, log_dir: Path) -> None:
        """Start a daemon that serves only this GPU; raise OSError when it cannot."""
        ...

    def alive(self, pipe_dir: Path) -> bool:
        """Whether the daemon behind this pipe directory answers."""
        ...

    def stop(self, pipe_dir: Path) -> None:
        """Ask the daemon to quit."""
        ...


class MpsControl:
    """The real runner: ``nvidia-cuda-mps-control`` (needs the NVIDIA driver's MPS tools)."""

    binary = "nvidia-cuda-mps-control"

    def _env(self, pipe_dir: Path, **extra: str) -> dict[str, str]:
        return {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir), **extra}

    def missing(self) -> str | None:
        """Why MPS cannot run here; None when it can."""
        if shutil.which(self.binary) is None:
            return (
                f"node mode is mps but {self.binary} is not on PATH in the device plugin's "
                f"container: mount the NVIDIA driver's MPS tools, or start with --isolation none"
            )
        return None

    def start(self, gpu: GpuInfo, pipe_dir: Path, log_dir: Path) -> None:
        """``nvidia-cuda-mps-control -d`` with only this GPU visible."""
        env = self._env(
            pipe_dir, CUDA_MPS_LOG_DIRECTORY=str(log_dir), CUDA_VISIBLE_DEVICES=gpu.uuid
        )
        done = subprocess.run(
            [self.binary, "-d"], env=env, capture_output=True, text=True, timeout=30
        )
        if done.returncode != 0:
            raise OSError(f"{self.binary} -d exited {done.returncode}: {done.stderr.strip()}")

    def _ask(self, pipe_dir: Path, command: str) -> bool:
        try:
            done = subprocess.run(
                [self.binary],
                input=command + "\n",
                env=self._env(pipe_dir),
                capture_output=True,
                text=True,
                timeout=10,
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
        return done.returncode == 0

    def alive(self, pipe_dir: Path) -> bool:
        """``get_server_list`` answers."""
        return self._ask(pipe_dir, "get_server_list")

    def stop(self, pipe_dir: Path) -> None:
        """``quit``."""
        self._ask(pipe_dir, "quit")
