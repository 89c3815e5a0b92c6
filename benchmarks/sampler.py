"""Run a Python program with a sampling profiler inside it: where its main thread spends time.

    python benchmarks/sampler.py OUT PROGRAM [ARGS...]

A thread reads the main thread's stack (``sys._current_frames``) every ``GPUSHARE_SAMPLE_MS``
milliseconds (5 by default) and counts each stack as ``file:function`` frames joined by ``;``,
outermost first. Every 5 s, and at exit, the counts are written to OUT as ``stack count``
lines (the collapsed format ``benchmarks/throughput.py`` reads); SIGUSR1 starts the counts
over. A sample whose innermost frame
is the event loop waiting for something (``select``, ``run_forever``) is idle time.

Used by ``benchmarks/throughput.py --profile`` on the extender, where py-spy is not
installed. The sampler takes the GIL for each sample, so it costs the program about 1 % at
200 samples a second.
"""

from __future__ import annotations

import atexit
import os
import runpy
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from types import FrameType

INTERVAL_S = float(os.environ.get("GPUSHARE_SAMPLE_MS", "5")) / 1000
FLUSH_S = 5.0


def _stack(frame: FrameType | None) -> str:
    names = []
    while frame is not None:
        code = frame.f_code
        names.append(f"{Path(code.co_filename).name}:{code.co_name}")
        frame = frame.f_back
    return ";".join(reversed(names))


class Sampler:
    """Counts the main thread's stacks until stopped; ``write`` puts them in a file."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.counts: Counter[str] = Counter()
        self._main = threading.main_thread().ident
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)
        self.restart = False
        """Set (by SIGUSR1) to drop what was counted so far."""

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        flushed = time.monotonic()
        while True:
            time.sleep(INTERVAL_S)
            frame = sys._current_frames().get(self._main or 0)
            with self._lock:
                if self.restart:
                    self.counts.clear()
                    self.restart = False
                if frame is not None:
                    self.counts[_stack(frame)] += 1
            if time.monotonic() - flushed >= FLUSH_S:
                self.write()
                flushed = time.monotonic()

    def write(self) -> None:
        with self._lock:
            lines = [f"{stack} {n}" for stack, n in self.counts.items()]
        tmp = self.out.with_suffix(".tmp")
        tmp.write_text("\n".join(lines) + "\n")
        tmp.replace(self.out)


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit("usage: python benchmarks/sampler.py OUT PROGRAM [ARGS...]")
    out, program = Path(sys.argv[1]), sys.argv[2]
    sampler = Sampler(out)
    atexit.register(sampler.write)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # atexit writes the last counts
    signal.signal(signal.SIGUSR1, lambda *_: setattr(sampler, "restart", True))
    sys.argv = sys.argv[2:]
    sampler.start()
    runpy.run_path(program, run_name="__main__")


if __name__ == "__main__":
    main()
