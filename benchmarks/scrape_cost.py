"""What one Prometheus scrape of the extender costs at scale, in-process.

Builds N nodes x 8 GPUs (15 GiB each, a quarter of them half used) in the in-memory API and
times ``GET /metrics`` through the real app over ASGI: the whole scrape, and the longest the
event loop waited for a turn meanwhile (what a kube-scheduler call arriving during the scrape
waits at most). The reference in the same run is a ``GET /healthz`` round trip through the
same stack, because this machine is noisy and only ratios compare across runs.

    .venv/bin/python benchmarks/scrape_cost.py [--nodes 1000 5000] [--scrapes 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from typing import Any

import httpx
from extender_latency import in_memory_extender  # this folder, as a script's sys.path has it

from gpushare.extender.app import create_app
from gpushare.extender.driver import ExtenderDriver
from gpushare.kube.objects import gpu_pod


async def longest_wait(stop: asyncio.Event, waits: list[float]) -> None:
    """Record how long each turn of the event loop took to come round."""
    last = time.perf_counter()
    while not stop.is_set():
        await asyncio.sleep(0)
        now = time.perf_counter()
        waits.append(now - last)
        last = now


async def served(app: Any, path: str) -> bytes:
    """One GET straight through the ASGI app, the body kept as the server sends it (a client
    in this process would add its own decoding to the event loop's turns)."""
    chunks: list[bytes] = []
    asked = False
    done = asyncio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal asked
        if asked:  # as a server does: the client stays until the answer is sent
            await done.wait()
            return {"type": "http.disconnect"}
        asked = True
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"x")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    await app(scope, receive, send)
    done.set()
    return b"".join(chunks)


async def one(nodes: int, scrapes: int) -> None:
    kube, names, extender = await in_memory_extender(nodes)
    app = create_app(extender)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x")
    driver = ExtenderDriver(client)
    for i, name in enumerate(names[: nodes // 4]):
        pod = kube.create_pod(gpu_pod(f"p{i}", mem=7))
        await driver.schedule(pod, [name])
    reference = []
    for _ in range(100):
        start = time.perf_counter()
        await served(app, "/healthz")
        reference.append(time.perf_counter() - start)
    ref = statistics.median(reference)
    for n in range(scrapes):
        stop, waits = asyncio.Event(), []
        ticker = asyncio.create_task(longest_wait(stop, waits))
        await asyncio.sleep(0)
        start = time.perf_counter()
        body = await served(app, "/metrics")
        took = time.perf_counter() - start
        stop.set()
        await ticker
        lines = body.count(b"\n")
        print(
            f"{nodes} nodes, scrape {n + 1}: {took * 1000:.1f} ms ({took / ref:.0f} x /healthz "
            f"{ref * 1000:.2f} ms), longest wait for a turn {max(waits) * 1000:.1f} ms, "
            f"{lines} lines, {len(body) / 2**20:.1f} MiB",
            flush=True,
        )
    await client.aclose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--scrapes", type=int, default=3)
    options = parser.parse_args(argv)
    for nodes in options.nodes:
        print(f"building {nodes} nodes...", file=sys.stderr, flush=True)
        asyncio.run(one(nodes, options.scrapes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
