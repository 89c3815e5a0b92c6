"""The device plugin's accounting broker in a process of its own, driven by lines on stdin.

The steps need the broker that Allocate opens for each container (``node/enforcement/broker.py``):
the interposer asks it before every allocation, and a process's memory comes back when its
connection closes. The plugin's isolation hook would bring the rest of the plugin (and its
dependencies) with it, so this serves the broker alone, on its own event loop:

- ``open KEY BYTES`` serves a fresh account of BYTES (comma-separated per device) at
  ``ROOT/KEY/broker.sock`` and answers ``opened <socket>``;
- ``usage KEY`` answers ``usage <bytes>[,<bytes>...]`` (``usage none`` if not served);
- end of input closes every account and exits.

    python -m tests.gpu.probes.brokering ROOT
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from gpushare.node.enforcement.broker import SOCKET_NAME, Broker


def answer(broker: Broker, line: str) -> str:
    """The reply to one command line."""
    words = line.split()
    if len(words) == 3 and words[0] == "open":
        limits = tuple(int(b) for b in words[2].split(","))
        return f"opened {broker.open(words[1], limits) / SOCKET_NAME}"
    if len(words) == 2 and words[0] == "usage":
        used = broker.usage(words[1])
        return "usage " + ("none" if used is None else ",".join(str(u) for u in used))
    return f"error: {line.strip()!r} is not 'open KEY BYTES' or 'usage KEY'"


async def serve(root: Path) -> None:
    """Answer commands from stdin until it closes."""
    broker = Broker(root)
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            break
        print(answer(broker, line), flush=True)
    broker.close()


if __name__ == "__main__":
    asyncio.run(serve(Path(sys.argv[1])))
