"""Runs of several policies over several seeds: the process pool, and differences paired by seed.

The churn and autoscaling protocols both run every (policy, seed) pair on its own and compare
policies seed by seed: the same seed gives every policy the same stream, so the difference on
one seed is free of the stream's own spread, and its sd across seeds says how sure it is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Generic, Protocol, TypeVar


class SeedRun(Protocol):
    """What a run is identified by."""

    @property
    def policy(self) -> str: ...

    @property
    def seed(self) -> int: ...


R = TypeVar("R", bound=SeedRun)


class PairedRuns(Generic[R]):
    """Runs of one trace, looked up by policy and paired by seed (``runs`` is a field of the
    dataclass that inherits)."""

    runs: list[R]

    def of(self, policy: str) -> list[R]:
        return [r for r in self.runs if r.policy == policy]

    def values(self, policy: str, metric: str) -> list[float]:
        return [float(getattr(r, metric)) for r in self.of(policy)]

    def paired(self, policy: str, reference: str, metric: str) -> list[float]:
        """(policy - reference) of ``metric`` on each seed both ran."""
        theirs = {r.seed: float(getattr(r, metric)) for r in self.of(reference)}
        return [
            float(getattr(r, metric)) - theirs[r.seed] for r in self.of(policy) if r.seed in theirs
        ]


def run_all(
    one: Callable[[str, int], R],
    policies: Sequence[str],
    seeds: Sequence[int],
    *,
    workers: int = 1,
    progress: Callable[[R], None] | None = None,
) -> list[R]:
    """``one(policy, seed)`` for every pair, in a process pool when ``workers`` > 1 (``one``
    must then pickle: a module-level function or a ``functools.partial`` of one); sorted by
    policy as given, then seed."""
    jobs = [(policy, seed) for policy in policies for seed in seeds]
    runs: list[R] = []
    if workers <= 1:
        for policy, seed in jobs:
            runs.append(one(policy, seed))
            if progress:
                progress(runs[-1])
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = [pool.submit(one, policy, seed) for policy, seed in jobs]
            for future in as_completed(futures):
                runs.append(future.result())
                if progress:
                    progress(runs[-1])
    runs.sort(key=lambda r: (list(policies).index(r.policy), r.seed))
    return runs
