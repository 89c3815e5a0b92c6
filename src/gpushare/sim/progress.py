"""Progress of ``gpushare simulate`` as plain lines, for logs, pipes and CI.

A terminal gets rich's progress bar; anything else (``| tee``, a CI log, a file) would get
nothing from it, since the bar is drawn with cursor moves that a pipe does not replay. So
there the CLI prints one line per finished (policy, seed) run instead, at most one every
``every`` seconds (the last run always has its line), with how far it is and how long is left:

    run 5/12 (42 %): fgd seed 1 done in 3.1 s; 0:12 elapsed, about 0:17 left
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol


class Finished(Protocol):
    """A finished run as the progress line names it (``SeedResult``, ``churn.ChurnRun``)."""

    @property
    def policy(self) -> str: ...

    @property
    def seed(self) -> int: ...

    @property
    def seconds(self) -> float: ...


def clock_text(seconds: float) -> str:
    """``m:ss`` (``h:mm:ss`` past an hour)."""
    whole = max(0, round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class PlainProgress:
    """Call it with each finished run; it says a line now and then through ``say``."""

    def __init__(
        self,
        total: int,
        *,
        say: Callable[[str], None],
        every: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total = total
        self.done = 0
        self.say = say
        self.every = every
        self.clock = clock
        self.started = clock()
        self.last: float | None = None

    def __call__(self, result: Finished) -> None:
        self.done += 1
        now = self.clock()
        final = self.done >= self.total
        if not final and self.last is not None and now - self.last < self.every:
            return
        self.last = now
        elapsed = now - self.started
        percent = 100 * self.done // max(1, self.total)
        line = (
            f"run {self.done}/{self.total} ({percent} %): {result.policy} seed {result.seed} "
            f"done in {result.seconds:.1f} s; {clock_text(elapsed)} elapsed"
        )
        if not final:
            left = elapsed / self.done * (self.total - self.done)
            line += f", about {clock_text(left)} left"
        self.say(line)
