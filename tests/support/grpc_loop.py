"""One event loop for every test that uses grpc.aio.

grpc.aio keeps process-wide state (a poller thread) tied to the loop it first ran on. With a
fresh ``asyncio.run`` per test, gRPC objects of an earlier test can be finalised later, from a
garbage collection inside some unrelated test, after their loop has closed; grpc then waits for
its poller forever. So gRPC tests share this loop, and it is drained and closed once, at the end
of the session (tests/conftest.py).
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_runner: asyncio.Runner | None = None


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on the shared loop."""
    global _runner
    if _runner is None:
        _runner = asyncio.Runner()
    return _runner.run(coro)


async def _drain() -> None:
    gc.collect()
    await asyncio.sleep(0.2)


def close() -> None:
    """Finalise what gRPC left behind while the loop still runs, then close it."""
    global _runner
    if _runner is not None:
        _runner.run(_drain())
        _runner.close()
        _runner = None
