"""Where the GPUs come from: NVML on a real node, or a fake backend for tests and kwok clusters.

Both sit behind one small port (``GpuSource``): the list of GPUs, how they are connected, and a
way to wait for a change of health. The NVML backend watches XID critical-error events in a
thread and reads the interconnect once at start (``interconnect.py``: cards are not re-cabled
while the node runs); the fake one changes health when told to (``set_health``), which is how
tests withdraw a GPU, and is connected as its ``--fake-topology`` says.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from gpushare.core.model.topology import Distance, layout
from gpushare.core.model.units import MemoryUnit
from gpushare.node.driverroot import DriverRoot, load_nvml
from gpushare.node.interconnect import read_interconnect

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuInfo:
    """One physical GPU as the device plugin sees it."""

    index: int
    uuid: str
    model: str
    memory_mib: int
    healthy: bool = True
    minor: int | None = None
    """The driver's minor number, ``/dev/nvidia<minor>`` (NVML's, or the index of a fake GPU);
    None when NVML did not say. The ``driver-root`` hand-off names the device node by it."""


def mem_units(gpu: GpuInfo, unit: MemoryUnit) -> int:
    """Whole memory units a GPU offers."""
    return gpu.memory_mib // unit.mib


class GpuSource(Protocol):
    """The GPUs of this node."""

    def gpus(self) -> list[GpuInfo]:
        """The current list, in index order."""
        ...

    def topology(self) -> Distance:
        """Links between the GPUs in index order (``core.model.topology``); () when not known."""
        ...

    async def changed(self) -> None:
        """Return when health (or the list) changes."""
        ...


class _Notifier:
    """Lets threads and the event loop wake waiters of ``changed``."""

    def __init__(self) -> None:
        self._generation = 0
        self._cond: asyncio.Condition | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def wait(self) -> None:
        if self._cond is None:
            self._cond = asyncio.Condition()
            self._loop = asyncio.get_running_loop()
        seen = self._generation
        async with self._cond:
            await self._cond.wait_for(lambda: self._generation != seen)

    def notify(self) -> None:
        self._generation += 1
        if self._cond is None or self._loop is None:
            return
        cond = self._cond

        async def wake() -> None:
            async with cond:
                cond.notify_all()

        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            self._loop.create_task(wake())
        else:
            asyncio.run_coroutine_threadsafe(wake(), self._loop)


_SPEC = re.compile(r"^(?:(?P<count>\d+)x)?(?:(?P<model>[^:,]+):)?(?P<size>\d+)(?P<unit>GiB|MiB)$")


class FakeGpus:
    """GPUs described by a flag: ``4x15GiB`` or ``T4:15GiB,A10:24GiB``.

    Health changes by ``set_health`` in the same process, or, when ``health_file`` is given,
    by writing the indexes of the failed GPUs into that file (comma- or line-separated; empty
    means all healthy): a test drives a device plugin running as its own process that way.
    """

    def __init__(
        self, gpus: list[GpuInfo], *, health_file: Path | None = None, topology: Distance = ()
    ) -> None:
        self._gpus = gpus
        self._topology = topology
        self._notifier = _Notifier()
        self._health_file = health_file
        if health_file is not None:
            self._apply(self._read_failed())

    @classmethod
    def parse(
        cls,
        spec: str,
        *,
        node: str = "fake",
        health_file: Path | None = None,
        topology: str = "",
    ) -> FakeGpus:
        """Read the flags; a ValueError names the flag, the part that is wrong and the rule.

        ``topology`` (``--fake-topology``) is a layout of ``core.model.topology.LAYOUTS`` or an
        explicit matrix (``0,1;1,0``); empty: the node publishes none.
        """
        gpus: list[GpuInfo] = []
        for part in spec.replace(" ", "").split(","):
            match = _SPEC.match(part)
            if not match:
                raise ValueError(
                    f"--fake-gpus part {part!r} is not understood; write COUNTxSIZE "
                    f"(4x15GiB) or MODEL:SIZE (T4:15GiB), SIZE in GiB or MiB, comma-separated"
                )
            size = int(match["size"]) * (1024 if match["unit"] == "GiB" else 1)
            for _ in range(int(match["count"] or 1)):
                index = len(gpus)
                model = match["model"] or "Fake GPU"
                gpus.append(GpuInfo(index, f"GPU-fake-{node}-{index}", model, size, minor=index))
        distance: Distance = ()
        if topology.strip():
            distance, problem = layout(topology, len(gpus))
            if problem:
                raise ValueError(
                    f"--fake-topology {problem} (for --fake-gpus {spec}, {len(gpus)} GPUs)"
                )
        return cls(gpus, health_file=health_file, topology=distance)

    def gpus(self) -> list[GpuInfo]:
        """The current list."""
        return list(self._gpus)

    def topology(self) -> Distance:
        """The matrix ``--fake-topology`` described."""
        return self._topology

    def set_health(self, index: int, healthy: bool) -> None:
        """Flip one GPU's health, as an XID error (or its recovery) would."""
        self._gpus = [replace(g, healthy=healthy) if g.index == index else g for g in self._gpus]
        self._notifier.notify()

    def _read_failed(self) -> frozenset[int]:
        assert self._health_file is not None
        try:
            text = self._health_file.read_text()
        except OSError:
            return frozenset()
        return frozenset(int(t) for t in re.split(r"[,\s]+", text) if t.isdigit())

    def _apply(self, failed: frozenset[int]) -> bool:
        new = [replace(g, healthy=g.index not in failed) for g in self._gpus]
        changed = new != self._gpus
        self._gpus = new
        return changed

    async def changed(self) -> None:
        """Return after the next ``set_health`` (or change of the health file)."""
        if self._health_file is None:
            await self._notifier.wait()
            return
        while not self._apply(self._read_failed()):
            await asyncio.sleep(0.5)


class NvmlGpus:
    """GPUs from NVML (nvidia-ml-py); XID critical errors mark a GPU unhealthy.

    With a ``driver_root``, NVML is loaded from that directory (``driverroot.load_nvml``) rather
    than from the loader's search path, which the NVIDIA container runtime fills and nodes
    without it (GKE's Container-Optimized OS) leave empty.
    """

    APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
    """XIDs caused by applications, not the GPU; they do not withdraw it."""

    def __init__(self, driver_root: DriverRoot | None = None) -> None:
        import pynvml

        self._nvml: Any = pynvml
        if driver_root is not None:
            loaded = load_nvml(driver_root, pynvml)
            log.info("phase=nvml library=%s (--driver-root)", loaded)
        pynvml.nvmlInit()
        self._gpus: list[GpuInfo] = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            name = pynvml.nvmlDeviceGetName(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            self._gpus.append(
                GpuInfo(
                    index,
                    uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                    name.decode() if isinstance(name, bytes) else str(name),
                    int(memory.total) // (1024 * 1024),
                    minor=self._minor(handle),
                )
            )
        handles = [pynvml.nvmlDeviceGetHandleByIndex(g.index) for g in self._gpus]
        found = read_interconnect(pynvml, handles)
        if found.problem:
            log.warning("phase=topology %s", found.problem)
        elif found.distance:
            links = " ".join(f"{i}-{j}:{n}" for (i, j), n in sorted(found.links.items()))
            log.info("phase=topology gpus=%d nvlinks=%s", len(handles), links or "none")
        self._topology: Distance = found.distance
        self._notifier = _Notifier()
        self._thread = threading.Thread(target=self._watch, name="nvml-xid", daemon=True)
        self._thread.start()

    def _minor(self, handle: Any) -> int | None:
        """The GPU's minor number, or None where NVML does not give one (the driver-root
        hand-off then refuses, naming the GPU)."""
        try:
            return int(self._nvml.nvmlDeviceGetMinorNumber(handle))
        except self._nvml.NVMLError:
            return None

    def _watch(self) -> None:
        nvml = self._nvml
        try:
            events = nvml.nvmlEventSetCreate()
            for gpu in self._gpus:
                handle = nvml.nvmlDeviceGetHandleByIndex(gpu.index)
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, events)
        except nvml.NVMLError:
            return  # events unsupported (e.g. in some VMs): health stays as found
        while True:
            try:
                data = nvml.nvmlEventSetWait(events, 5000)
            except nvml.NVMLError:
                continue
            if data.eventData in self.APPLICATION_XIDS:
                continue
            uuid = nvml.nvmlDeviceGetUUID(data.device)
            uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
            self._gpus = [replace(g, healthy=False) if g.uuid == uuid else g for g in self._gpus]
            self._notifier.notify()

    def gpus(self) -> list[GpuInfo]:
        """The GPUs found at start, with their current health."""
        return list(self._gpus)

    def topology(self) -> Distance:
        """The interconnect read at start (``interconnect.read_interconnect``)."""
        return self._topology

    async def changed(self) -> None:
        """Return after the next XID critical error."""
        await self._notifier.wait()
