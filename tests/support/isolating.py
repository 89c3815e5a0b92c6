"""The isolation hooks in the plugin rig: a fake library, hooks per mode, admitting pods.

Also the broker's socket asked directly, and a stand-in for the MPS control daemons.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

from gpushare.core.model.units import MemoryUnit
from gpushare.isolation.build import LIB_NAME
from gpushare.node.enforcement.nodehook import NodeIsolation
from gpushare.node.gpus import FakeGpus, GpuInfo
from tests.support.pluginrig import Rig

GiB = 2**30


def fake_library() -> Path:
    path = Path(tempfile.mkdtemp(prefix="gs-lib-", dir="/tmp")) / LIB_NAME
    path.write_bytes(b"\x7fELF fake interposer")
    return path


def isolation(
    policy: str = "auto",
    packaged: Path | None = None,
    daemons: FakeDaemons | None = None,
    **settings: Any,
) -> Any:
    """The hook a rig builds; ``settings`` are more of NodeIsolation's keywords (``caps``)."""

    def make(root: Path, source: FakeGpus) -> NodeIsolation:
        return NodeIsolation(
            policy=policy,
            lib_dir=root / "lib",
            state_dir=root / "state",
            unit=MemoryUnit.GiB,
            source=source,
            runner=daemons or FakeDaemons(),
            packaged=packaged,
            **settings,
        )

    return make


async def admit(r: Rig, manifest: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    placed = await r.place(manifest)
    assert placed is not None
    return placed, await r.kubelet.admit(placed)


async def ask(path: Path, *lines: str) -> list[str]:
    """Lines to a broker socket, as a container process would send them; the answers."""
    reader, writer = await asyncio.open_unix_connection(str(path))
    answers = []
    for line in lines:
        writer.write(line.encode() + b"\n")
        answers.append((await reader.readline()).decode().rstrip("\n"))
    writer.close()
    await writer.wait_closed()
    return answers


class FakeDaemons:
    """MPS control daemons as a dictionary: pipe directory -> GPU uuid."""

    def __init__(self) -> None:
        self.running: dict[Path, str] = {}
        self.starts: list[str] = []
        self.stops: list[Path] = []

    def missing(self) -> str | None:
        return None

    def start(self, gpu: GpuInfo, pipe_dir: Path, log_dir: Path) -> None:
        assert pipe_dir.is_dir() and log_dir.is_dir()
        self.running[pipe_dir] = gpu.uuid
        self.starts.append(gpu.uuid)

    def alive(self, pipe_dir: Path) -> bool:
        return pipe_dir in self.running

    def stop(self, pipe_dir: Path) -> None:
        self.stops.append(pipe_dir)
        self.running.pop(pipe_dir, None)
