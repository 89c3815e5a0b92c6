"""How long to wait before talking to the API server again after a failure.

A list of every node and pod is the most expensive read the API server serves. Retrying it
every second while the server is down or overloaded makes each gpushare process one more
client hammering it as it comes back, and all replicas in step. So the wait doubles with each
failure in a row, from ``base_s`` up to ``cap_s``, with equal jitter: half of the ceiling for
sure (no tight loop, even on an unlucky draw) and the other half at random (replicas that failed
together retry apart). With the defaults the waits are 0.5-1 s, 1-2 s, 2-4 s, ... and 15-30 s
from the sixth failure on.

The count starts over in two ways:

- ``reset()``, which the caller calls on proof that the server answers again: a watch event,
  a watch that ended normally, a check that went through. A successful list alone is not
  proof enough: when the list works and the watch right after it fails at once (a watch
  refused by RBAC, a proxy that cuts streams), resetting on the list would relist everything
  every second, which is what this is here to prevent;
- on its own, when the last failure lies more than ``quiet_s`` back: a watch that ran quietly
  for an hour and then broke (an API server upgrade) is retried at ``base_s`` again, not at
  the wait an outage long ago had reached.

The clock and the random draw are passed in, so tests check the waits without sleeping.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_DOUBLINGS = 60
"""Beyond this the ceiling is ``cap_s`` anyway; it keeps ``2**n`` a small number."""


@dataclass
class Backoff:
    """Waits that grow with each failure in a row; see the module docstring."""

    base_s: float = 1.0
    """Ceiling of the first wait, in seconds: the first retry comes within it."""
    cap_s: float = 30.0
    """Largest ceiling, in seconds: how stale the cache can get after the server is back."""
    quiet_s: float = 120.0
    """Seconds without a failure after which the count starts over on its own."""
    draw: Callable[[], float] = random.random
    """Uniform in [0, 1): the jitter."""
    clock: Callable[[], float] = time.monotonic
    """Seconds, for ``quiet_s``."""
    failures: int = field(default=0, init=False)
    """Failures in a row since the last reset."""
    _last_failure: float | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.base_s <= self.cap_s:
            raise ValueError(
                f"backoff needs 0 < base_s <= cap_s, got base_s={self.base_s} cap_s={self.cap_s}"
            )

    def ceiling(self) -> float:
        """The most the next wait can be, in seconds."""
        return min(self.cap_s, self.base_s * float(2 ** min(self.failures, MAX_DOUBLINGS)))

    def failed(self) -> float:
        """Count one failure and return how many seconds to wait before the next try."""
        now = self.clock()
        if self._last_failure is not None and now - self._last_failure > self.quiet_s:
            self.failures = 0
        ceiling = self.ceiling()
        self.failures += 1
        self._last_failure = now
        return ceiling / 2 + ceiling / 2 * self.draw()

    def reset(self) -> None:
        """The server answered: the next failure waits at most ``base_s`` again."""
        self.failures = 0
