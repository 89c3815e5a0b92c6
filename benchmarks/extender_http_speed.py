"""B3 through HTTP: filter + prioritize + bind round trips per pod, node names only.

The openb GPU nodes (``../shared/traces/openb/openb_node_list_gpu_node.csv``, or the built-in
synthetic cluster when the traces are absent), optionally replicated, become gpushare ``share``
nodes in the in-memory Kubernetes API: each GPU has its model's memory (BENCHMARKS.md's per-model
MiB table) in whole 1 GiB units, rounded down as the device plugin counts it. The B1 arrival
stream (seed 0, CPU-only pods left out: they never reach the extender) becomes GPU pods: a share
of ``gpu_milli`` asks for that fraction of its card's memory rounded up, a whole-GPU pod for all
of it on each of its GPUs with the ``aliyun.com/gpu-count`` label. The card is the first model
of the pod's ``gpu_spec``, or the cluster's most common model when the pod names none.

Two processes, as in a cluster where kube-scheduler is a Go process of its own: each policy gets
a fresh server process (the real app over the in-memory API, its cache's list-then-watch task
running, served by uvicorn with the options ``gpushare extender`` uses, on 127.0.0.1), and this
process drives it over one keep-alive connection with TCP_NODELAY, writing pre-serialised
request bytes and reading only the reply fields it needs (msgspec), so the client takes as
little of the two cores as it can. For each pod: create it in the API through a benchmark route
(not timed), POST /filter with the node names (``nodeCacheCapable``), POST /prioritize with the
names that passed, pick the best score (ties to the first), POST /bind.

``--names all`` (the default) sends every node name to filter, as B3 asks; ``--names sample``
sends what kube-scheduler itself would at that size: ``numFeasibleNodesToFind`` names (its
adaptive ``percentageOfNodesToScore``: 50 % - 1 % per 125 nodes, at least 5 % and 100 nodes),
taken round-robin from where the previous pod stopped (its other plugins assumed to pass all).

Reported per policy: p50 / p99 / max of the per-pod round trip in ms; the p50 of the time spent
inside the app for the pod's three calls (the extender's own work, FastAPI's parsing and writing
included; the rest is uvicorn, the socket and the client); the p50 of the client's own CPU time
per pod; a bare GET /healthz round trip with the same client in the same server (the floor of
one call); pods/s (pods / summed round trips), pods bound, and pods/s as a ratio to binpack
measured in the same run. ``--profile DIR`` writes each server's cProfile to DIR.

    .venv/bin/python benchmarks/extender_http_speed.py [--replicas 1 4] [--pods 2000] \
        [--names all|sample] [--policy fgd ...] [--profile DIR]
"""

from __future__ import annotations

import argparse
import cProfile
import math
import multiprocessing
import operator
import os
import socket
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import pairwise
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import msgspec
import uvicorn

from gpushare.core.decision.scheduling import Scheduler, Settings
from gpushare.extender.app import create_app, server_config
from gpushare.extender.service import Extender
from gpushare.kube.cache import ClusterCache
from gpushare.kube.memory import MemoryKube
from gpushare.kube.objects import gpu_node, gpu_pod
from gpushare.sim import cards, synthetic
from gpushare.sim.openb import MILLI_PER_GPU, TraceNode, TracePod, read_nodes, read_pods
from gpushare.sim.stream import arrival_stream

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "openb"
MIB_PER_UNIT = 1024
by_score = operator.attrgetter("Score")


def card_mib(model: str) -> int:
    """A card's memory in MiB, from the simulator's per-model table (BENCHMARKS.md)."""
    mib = cards.memory_mib(model)
    if mib is None:
        raise SystemExit(
            f"error: model={model!r} has no memory in the per-model table "
            f"({cards.known_models()}); add it to gpushare.sim.cards"
        )
    return mib


def card_units(model: str) -> int:
    """A card's memory in 1 GiB units, rounded down as the device plugin counts it."""
    return card_mib(model) // MIB_PER_UNIT


def load(replicas: int) -> tuple[list[TraceNode], list[TracePod], str]:
    """The cluster and the trace pods (openb when present, else synthetic), replicated."""
    node_file = TRACES / "openb_node_list_gpu_node.csv"
    if node_file.exists():
        nodes = read_nodes(node_file)
        pods = read_pods(TRACES / "openb_pod_list_default.csv")
        source = "openb"
    else:
        nodes = synthetic.nodes()
        pods = synthetic.pods(nodes)
        source = "synthetic (openb traces not found)"
    if replicas > 1:
        nodes = [replace(n, name=f"{n.name}-r{r}") for r in range(replicas) for n in nodes]
        pods = [replace(p, name=f"{p.name}-r{r}") for r in range(replicas) for p in pods]
    return nodes, pods, source


def pod_object(pod: TracePod, index: int, default_model: str) -> dict[str, Any] | None:
    """The gpu-mem pod a user would write for the trace pod; None for CPU-only pods."""
    if pod.num_gpu == 0:
        return None
    model = pod.gpu_spec[0] if pod.gpu_spec else default_model
    if pod.gpu_milli >= MILLI_PER_GPU:
        per_gpu = card_units(model)
    else:
        per_gpu = math.ceil(pod.gpu_milli * card_mib(model) / MILLI_PER_GPU / MIB_PER_UNIT)
    count = str(pod.num_gpu) if pod.num_gpu > 1 else None
    obj = gpu_pod(f"p{index:06d}", mem=per_gpu * pod.num_gpu, gpu_count=count)
    obj["metadata"]["uid"] = f"uid-{index:06d}"
    return obj


def feasible_to_find(nodes: int) -> int:
    """kube-scheduler's numFeasibleNodesToFind with the default percentageOfNodesToScore."""
    if nodes < 100:
        return nodes
    percent = max(5, 50 - nodes // 125)
    return max(100, nodes * percent // 100)


class BenchApp:
    """The extender app, timed, beside the benchmark's own routes (outside the timing).

    ``POST /bench/pod`` creates a pod in the in-memory API and answers it with the seconds
    spent inside the app so far; ``POST /bench/stop`` ends the server.
    """

    def __init__(self, app: Any, kube: MemoryKube) -> None:
        self.app = app
        self.kube = kube
        self.seconds = 0.0
        self.server: uvicorn.Server | None = None

    async def _reply(self, send: Any, body: bytes) -> None:
        length = str(len(body)).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", length)]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if path == "/bench/pod":
            chunks = []
            more = True
            while more:
                message = await receive()
                chunks.append(message.get("body", b""))
                more = message.get("more_body", False)
            pod = self.kube.create_pod(msgspec.json.decode(b"".join(chunks)))
            await self._reply(send, msgspec.json.encode({"inside": self.seconds, "pod": pod}))
            return
        if path == "/bench/stop":
            if self.server is not None:
                self.server.should_exit = True
            await self._reply(send, b"{}")
            return
        start = time.perf_counter()
        try:
            await self.app(scope, receive, send)
        finally:
            self.seconds += time.perf_counter() - start


def serve(policy: str, nodes: Sequence[TraceNode], ports: Connection, profile: str) -> None:
    """The server process: a fresh API, cache and extender for one policy."""
    kube = MemoryKube()
    for node in nodes:
        units = card_units(node.model)
        kube.put_node(gpu_node(node.name, gpus_units=[units] * node.gpus, model=node.model))
    settings = Settings(policy=policy)
    scheduler = Scheduler(settings)
    cache = ClusterCache(kube, settings=settings, workload=scheduler.workload)
    app = BenchApp(
        create_app(Extender(api=kube, cache=cache, scheduler=scheduler), run_cache=True), kube
    )
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    app.server = server = uvicorn.Server(
        server_config(app, host="127.0.0.1", port=0, log_level="warning")
    )
    ports.send(sock.getsockname()[1])
    if not profile:
        server.run(sockets=[sock])
        return
    profiler = cProfile.Profile()
    profiler.runcall(server.run, sockets=[sock])
    profiler.dump_stats(profile)


class Client:
    """One keep-alive HTTP/1.1 connection with TCP_NODELAY, as Go's net/http keeps one."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.rest = b""

    def request(self, method: bytes, path: bytes, body: bytes = b"") -> tuple[int, bytes]:
        """Send one request; the reply's status and body."""
        self.sock.sendall(
            b"%s %s HTTP/1.1\r\nhost: extender\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (method, path, len(body), body)
        )
        data = self.rest
        while (end := data.find(b"\r\n\r\n")) < 0:
            data += self._recv()
        status, *headers = data[:end].split(b"\r\n")
        length = -1
        for line in headers:
            key, _, value = line.partition(b":")
            if key.lower() == b"content-length":
                length = int(value)
        if length < 0:
            raise SystemExit(f"error: {path.decode()} answered without content-length")
        chunks = [data[end + 4 :]]
        have = len(chunks[0])
        while have < length:
            chunk = self._recv()
            chunks.append(chunk)
            have += len(chunk)
        data = b"".join(chunks)
        self.rest = data[length:]
        return int(status.split()[1]), data[:length]

    def call(self, method: bytes, path: bytes, body: bytes = b"") -> bytes:
        """The body of a 200 reply; any other status ends the benchmark."""
        status, reply = self.request(method, path, body)
        if status != 200:
            raise SystemExit(f"error: {path.decode()} answered {status}: {reply[:300]!r}")
        return reply

    def _recv(self) -> bytes:
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise SystemExit("error: the extender closed the connection")
        return chunk


class Created(msgspec.Struct):
    inside: float
    pod: msgspec.Raw


class Filtered(msgspec.Struct):
    NodeNames: list[str] | None = None


class Priority(msgspec.Struct):
    Host: str
    Score: int


class Bound(msgspec.Struct):
    Error: str = ""


@dataclass
class Measured:
    """One policy's round trips."""

    pods: int
    bound: int
    app_p50_ms: float
    client_p50_ms: float
    healthz_p50_ms: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    pods_per_s: float


def drive(
    client: Client, stream: Sequence[dict[str, Any]], names: Sequence[str], sample: int
) -> Measured:
    """Schedule the stream through the server behind ``client``."""
    healthz = []
    for _ in range(300):
        start = time.perf_counter()
        client.call(b"GET", b"/healthz")
        healthz.append(time.perf_counter() - start)
    encode = msgspec.json.encode
    created_of = msgspec.json.Decoder(Created).decode
    filtered_of = msgspec.json.Decoder(Filtered).decode
    priorities_of = msgspec.json.Decoder(list[Priority]).decode
    bound_of = msgspec.json.Decoder(Bound).decode
    names_json = encode(list(names))
    latencies: list[float] = []
    client_cpu: list[float] = []
    marks: list[float] = []
    bound = 0
    offset = 0
    for obj in stream:
        created = created_of(client.call(b"POST", b"/bench/pod", encode(obj)))
        marks.append(created.inside)
        pod = bytes(created.pod)
        if sample:
            window = [names[(offset + i) % len(names)] for i in range(sample)]
            offset = (offset + sample) % len(names)
            names_json = encode(window)
        cpu = time.process_time()
        start = time.perf_counter()
        body = b'{"Pod":%s,"NodeNames":%s}' % (pod, names_json)
        passing = filtered_of(client.call(b"POST", b"/filter", body)).NodeNames
        if passing:
            best = passing[0]
            if len(passing) > 1:  # kube-scheduler takes a lone node unscored
                body = b'{"Pod":%s,"NodeNames":%s}' % (pod, encode(passing))
                scores = priorities_of(client.call(b"POST", b"/prioritize", body))
                best = max(scores, key=by_score).Host if scores else best
            meta = obj["metadata"]
            body = encode(
                {
                    "PodName": meta["name"],
                    "PodNamespace": "default",
                    "PodUID": meta["uid"],
                    "Node": best,
                }
            )
            bound += not bound_of(client.call(b"POST", b"/bind", body)).Error
        latencies.append(time.perf_counter() - start)
        client_cpu.append(time.process_time() - cpu)
    marks.append(
        created_of(client.call(b"POST", b"/bench/pod", encode(gpu_pod("last", mem=1)))).inside
    )
    inside = [b - a for a, b in pairwise(marks)]
    ordered = sorted(latencies)
    return Measured(
        pods=len(ordered),
        bound=bound,
        app_p50_ms=statistics.median(inside) * 1e3,
        client_p50_ms=statistics.median(client_cpu) * 1e3,
        healthz_p50_ms=statistics.median(healthz) * 1e3,
        p50_ms=statistics.median(ordered) * 1e3,
        p99_ms=ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1e3,
        max_ms=ordered[-1] * 1e3,
        pods_per_s=len(ordered) / sum(ordered),
    )


def measure(
    policy: str,
    nodes: Sequence[TraceNode],
    stream: Sequence[dict[str, Any]],
    sample: int,
    profile: str,
) -> Measured:
    """Start a server process for one policy, drive it, stop it."""
    fork = multiprocessing.get_context("fork")
    ours, theirs = fork.Pipe()
    process = fork.Process(target=serve, args=(policy, nodes, theirs, profile))
    process.start()
    try:
        port = ours.recv()
        client: Client | None = None
        while client is None:
            try:
                client = Client(port)
            except ConnectionRefusedError:
                time.sleep(0.05)
        while client.request(b"GET", b"/readyz")[0] != 200:  # 503 until the cache has listed
            time.sleep(0.05)
        result = drive(client, stream, [n.name for n in nodes], sample)
        client.call(b"POST", b"/bench/stop")
        process.join(timeout=60)
    finally:
        if process.is_alive():
            process.terminate()
            process.join()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--pods", type=int, default=2000, help="GPU pods per run; 0: all")
    parser.add_argument("--names", choices=("all", "sample"), default="all")
    parser.add_argument("--policy", action="append", help="repeatable; binpack always runs")
    parser.add_argument("--profile", default="", help="folder for each server's cProfile")
    args = parser.parse_args()
    policies = args.policy or ["binpack", "fgd", "gpushare"]
    policies = ["binpack", *(p for p in policies if p != "binpack")]
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    for k in args.replicas:
        nodes, trace, source = load(k)
        default_model = Counter(n.model for n in nodes for _ in range(n.gpus)).most_common(1)[0][0]
        stream = []
        for pod in arrival_stream(trace, nodes, seed=0):
            obj = pod_object(pod, len(stream), default_model)
            if obj is not None:
                stream.append(obj)
        if args.pods:
            stream = stream[: args.pods]
        gpus = sum(n.gpus for n in nodes)
        sample = feasible_to_find(len(nodes)) if args.names == "sample" else 0
        sent = f"{sample} names a pod (kube-scheduler's sample)" if sample else "all names"
        print(f"\n{len(nodes)} nodes ({gpus} GPUs, {source}, x{k}), {len(stream)} GPU pods, {sent}")
        print(
            "| policy | pods | bound | p50 ms | p99 ms | max ms | in app p50 ms | "
            "client CPU p50 ms | /healthz p50 ms | pods/s | ratio to binpack |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        reference = 0.0
        for name in policies:
            profile = (
                f"{args.profile}/{name}-{len(nodes)}-{args.names}.prof" if args.profile else ""
            )
            result = measure(name, nodes, stream, sample, profile)
            reference = reference or result.pods_per_s
            print(
                f"| {name} | {result.pods} | {result.bound} | {result.p50_ms:.2f} | "
                f"{result.p99_ms:.2f} | {result.max_ms:.2f} | {result.app_p50_ms:.2f} | "
                f"{result.client_p50_ms:.2f} | {result.healthz_p50_ms:.2f} | "
                f"{result.pods_per_s:.0f} | {result.pods_per_s / reference:.2f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
