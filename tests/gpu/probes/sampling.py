"""NVML's own view of a run: each process's share of the GPU's time, and the SM clock.

A computing-power share is a share of the GPU's *time* (the slices of each 100 ms period). The
matmul rate is a second view of it, and a biased one: a GPU running flat out on fp16 matmuls
draws its power limit and lowers its clock, while one held to a third of its time does not, so a
30 % slice did about 35 % of the flat-out rate on an H100. NVML's per-process ``smUtil`` (the
time one of the process's kernels ran, per sample) is what ``nvidia-smi`` users read and what the
limit promises; the SM clock beside it shows the rate's bias.

Samples are polled every ``POLL_S`` (NVML keeps only a short history) and means taken over a
stretch of wall time afterwards. Without pynvml or a GPU the sampler records nothing and every
mean is None: the rehearsal checks the rate alone.
"""

from __future__ import annotations

import statistics
import threading
import time
from types import TracebackType
from typing import Any

POLL_S = 0.2


class NvmlSampler:
    """Poll GPU 0's per-process utilisation samples and SM clock in a thread."""

    def __init__(self) -> None:
        self.samples: dict[tuple[int, int], int] = {}
        """(pid, timestamp in µs since the epoch) -> smUtil %."""
        self.clocks: list[tuple[float, int]] = []
        """(wall time, SM clock MHz)."""
        self.problem = ""
        self._nvml: Any = None
        self._handle: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seen = 0

    def __enter__(self) -> NvmlSampler:
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception as err:  # no pynvml, no driver: the rehearsal
            self.problem = f"NVML cannot be read here: {type(err).__name__}: {err}"
            return self
        self._thread = threading.Thread(target=self._poll, name="nvml-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _poll(self) -> None:
        nvml = self._nvml
        while not self._stop.wait(POLL_S):
            try:
                self.clocks.append(
                    (time.time(), nvml.nvmlDeviceGetClockInfo(self._handle, nvml.NVML_CLOCK_SM))
                )
                got = nvml.nvmlDeviceGetProcessUtilization(self._handle, self._seen)
            except Exception:  # NVML_ERROR_NOT_FOUND: no sample since the last poll
                continue
            for s in got:
                self.samples[(int(s.pid), int(s.timeStamp))] = int(s.smUtil)
                self._seen = max(self._seen, int(s.timeStamp))

    def sm_pct(self, pid: int, start: float, end: float) -> float | None:
        """The mean smUtil of ``pid``'s samples stamped between two wall times, or None."""
        lo, hi = start * 1e6, end * 1e6
        got = [u for (p, ts), u in self.samples.items() if p == pid and lo <= ts <= hi]
        return round(statistics.mean(got), 1) if got else None

    def clock_mhz(self, start: float, end: float) -> float | None:
        """The mean SM clock between two wall times, or None."""
        got = [mhz for t, mhz in self.clocks if start <= t <= end]
        return round(statistics.mean(got)) if got else None

    def sm_pct_any(self, start: float, end: float) -> float | None:
        """The mean over sample times between two wall times of every process's smUtil summed
        (one process running: its time share, whatever pid NVML files it under), or None."""
        lo, hi = start * 1e6, end * 1e6
        by_time: dict[int, int] = {}
        for (_, ts), u in self.samples.items():
            if lo <= ts <= hi:
                by_time[ts] = by_time.get(ts, 0) + u
        return round(statistics.mean(by_time.values()), 1) if by_time else None
