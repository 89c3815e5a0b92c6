"""What one API write costs the extender's process: lightkube's client against the floor.

Every GPU pod costs the extender one ``pods/binding`` POST, and some an Event POST, through
``LightkubeAPI`` (lightkube over httpx, httpcore and h11). The staged benchmark cannot say how
much of the extender's CPU per pod those writes are, because its runs vary by a third. This
one starts the e2e harness's control plane (``harness/cluster.py``), then POSTs Events one at a
time, alternating two clients over the same kube-apiserver, and prints the CPU each write cost
this thread (``time.thread_time``: the Python work and the TLS, not the server's):

1. ``full``: ``LightkubeAPI.create_event``, as the extender writes an Event (a binding goes
   the same way, ``_create_unread``): lightkube, httpx, httpcore and h11 whole;
2. ``floor``: the same JSON in one HTTP/1.1 request over one kept-alive asyncio TLS stream,
   with the TLS context and headers of lightkube's own client, read back by Content-Length.
   It handles nothing but this exchange (no redirects, no auth flows, no chunked replies), so
   it is what a write cannot go below in Python, not a client to use.

Then, with a pod watch open as the extender's cache opens it (``LightkubeAPI.watch_pods``),
it creates ``--watched`` pods the size of a bound GPU pod (a ``kubectl create`` in another
process) and prints the CPU this thread spent per event taking them off the stream, decoded;
and the same for a second batch read by the floor: the watch's GET over one asyncio TLS
stream, its chunks framed by h11 and each line decoded by msgspec into the same dict.

    python benchmarks/write_cost.py [--writes 300] [--rounds 3] [--watched 1500]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import h11
import msgspec

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpushare.kube.lightkube_api import LightkubeAPI  # noqa: E402
from gpushare.kube.objects import gpu_pod  # noqa: E402
from harness.cluster import Cluster, running_cluster  # noqa: E402

NAMESPACE = "default"


def event(number: int) -> dict[str, Any]:
    """An Event the size of the extender's ``GPUShareScheduled``."""
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"write-cost-{number}", "namespace": NAMESPACE},
        "involvedObject": {"kind": "Pod", "namespace": NAMESPACE, "name": "p", "uid": "u"},
        "reason": "GPUShareScheduled",
        "message": "m" * 120,
        "type": "Normal",
        "source": {"component": "write-cost"},
        "firstTimestamp": "2026-01-01T00:00:00Z",
        "lastTimestamp": "2026-01-01T00:00:00Z",
        "count": 1,
    }


async def floor_stream(
    api: LightkubeAPI,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, list[tuple[str, str]]]:
    """A bare TLS stream to ``api``'s server with its client's TLS context, and that client's
    headers (Host first) for requests over it."""
    client: Any = api._client._client._client  # lightkube's httpx client: its TLS, its headers
    url = client.base_url
    reader, writer = await asyncio.open_connection(
        url.host, url.port, ssl=client._transport._pool._ssl_context, server_hostname=url.host
    )
    own = [(name, value) for name, value in client.headers.items() if name != "host"]
    return reader, writer, [("host", f"{url.host}:{url.port}"), *own]


class Floor:
    """One kept-alive TLS stream that POSTs a JSON body and reads the status and body back."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: str):
        self.reader, self.writer, self.head = reader, writer, head

    @classmethod
    async def open(cls, api: LightkubeAPI, path: str) -> Floor:
        reader, writer, headers = await floor_stream(api)
        lines = "".join(f"{name}: {value}\r\n" for name, value in headers)
        return cls(reader, writer, f"POST {path} HTTP/1.1\r\n{lines}")

    async def post(self, body: bytes) -> int:
        framing = f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
        self.writer.write(f"{self.head}{framing}".encode() + body)
        status = int((await self.reader.readline()).split()[1])
        length = 0
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
        await self.reader.readexactly(length)
        return status


async def cpu_per_call(call: Callable[[], Awaitable[Any]], times: int) -> float:
    """Milliseconds of this thread's CPU per awaited call (a write, or an event off a stream)."""
    start = time.thread_time()
    for _ in range(times):
        await call()
    return (time.thread_time() - start) / times * 1e3


async def measure(kubeconfig: Path, writes: int, rounds: int) -> None:
    full = LightkubeAPI.connect(str(kubeconfig))
    floor = await Floor.open(full, f"/api/v1/namespaces/{NAMESPACE}/events")
    numbers = itertools.count()

    async def through_lightkube() -> None:
        await full.create_event(NAMESPACE, event(next(numbers)))

    async def at_the_floor() -> None:
        status = await floor.post(msgspec.json.encode(event(next(numbers))))
        if status != 201:
            raise SystemExit(f"the floor's POST answered {status}, not 201")

    clients = {"full": through_lightkube, "floor": at_the_floor}
    for _ in range(20):  # connections open, caches warm
        for write in clients.values():
            await write()
    kept: dict[str, list[float]] = {name: [] for name in clients}
    for number in range(rounds):
        for name, write in clients.items():
            kept[name].append(await cpu_per_call(write, writes))
        said = ", ".join(f"{name} {kept[name][-1]:.2f} ms" for name in clients)
        print(f"round {number + 1}: {said} of CPU per write", file=sys.stderr, flush=True)
    medians = {name: statistics.median(values) for name, values in kept.items()}
    print(f"writes={writes} rounds={rounds} (Event POSTs, one at a time, alternated)")
    print(f"full client (lightkube, httpx):  median {medians['full']:.2f} ms of CPU per write")
    print(f"floor (one asyncio TLS stream):  median {medians['floor']:.2f} ms of CPU per write")
    print(f"full client over floor: {medians['full'] / medians['floor']:.1f}x")
    floor.writer.close()
    await full.close()


def watched_pods(count: int, batch: int) -> dict[str, Any]:
    """A List of pods nobody schedules, each with a GPU request and annotations the size of
    gpushare's allocation and seal."""
    pods = []
    for number in range(count):
        pod = gpu_pod(f"write-cost-watched-{batch}-{number}", mem=4, scheduler="write-cost-nobody")
        pod["metadata"]["annotations"] = {
            "gpushare.io/allocation": "a" * 300,
            "gpushare.io/seal": "s" * 64,
        }
        pods.append(pod)
    return {"apiVersion": "v1", "kind": "List", "items": pods}


async def floor_watch(api: LightkubeAPI, version: str) -> AsyncIterator[dict[str, Any]]:
    """The pod watch's GET over one asyncio TLS stream, framed by h11, each line decoded."""
    reader, writer, headers = await floor_stream(api)
    http = h11.Connection(h11.CLIENT)
    target = f"/api/v1/pods?watch=true&resourceVersion={version}"
    writer.write(
        http.send(h11.Request(method="GET", target=target, headers=headers))
        + http.send(h11.EndOfMessage())
    )
    decode = msgspec.json.Decoder(dict[str, Any]).decode
    rest = b""
    try:
        while True:
            event = http.next_event()
            if event is h11.NEED_DATA:
                http.receive_data(await reader.read(65536))
            elif isinstance(event, h11.Data):
                *lines, rest = (rest + bytes(event.data)).split(b"\n")
                for line in lines:
                    if line.strip():
                        yield decode(line)
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                return
    finally:
        writer.close()


async def watch_cost(cluster: Cluster, count: int) -> None:
    """CPU of this thread per pod event read off ``watch_pods``, then off the floor's watch,
    while another process creates ``count`` pods for each."""
    api = LightkubeAPI.connect(str(cluster.kubeconfig))
    folder = Path(tempfile.mkdtemp(prefix="gpushare-write-cost-"))
    spent: dict[str, float] = {}
    for batch, name in enumerate(("full", "floor")):
        _, version = await api.list_pods()
        stream: AsyncIterator[Any]
        if name == "full":
            stream = api.watch_pods(version).__aiter__()
        else:
            stream = floor_watch(api, version).__aiter__()
        listing = folder / f"pods-{batch}.json"
        listing.write_text(json.dumps(watched_pods(count, batch)))
        creating = asyncio.create_task(
            asyncio.to_thread(cluster.kubectl, "create", "-f", str(listing))
        )
        spent[name] = await cpu_per_call(stream.__anext__, count)
        await creating
        await stream.aclose()  # type: ignore[attr-defined]
    await api.close()
    print(f"watch: {count} pod events each, CPU per event taken off the stream and decoded:")
    print(f"full client (lightkube, httpx):  {spent['full']:.2f} ms")
    print(f"floor (TLS stream, h11, msgspec): {spent['floor']:.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--watched", type=int, default=1500)
    args = parser.parse_args()
    checked = (("--writes", args.writes), ("--rounds", args.rounds), ("--watched", args.watched))
    for name, value in checked:
        if value < 1:
            parser.error(f"{name} {value}: must be 1 or more")
    root = Path(tempfile.mkdtemp(prefix="gpushare-write-cost-"))
    progress = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    with running_cluster(root, progress, node_lease_s=600) as cluster:
        asyncio.run(measure(cluster.kubeconfig, args.writes, args.rounds))
        asyncio.run(watch_cost(cluster, args.watched))


if __name__ == "__main__":
    main()
