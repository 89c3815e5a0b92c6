"""B3 through HTTP: filter + prioritize + bind round trips per pod, node names only.

The openb GPU nodes (``../shared/traces/openb/openb_node_list_gpu_node.csv``, or the built-in
synthetic cluster when the traces are absent), optionally replicated, become gpushare ``share``
nodes in the in-memory Kubernetes API: each GPU has its model's memory (BENCHMARKS.md's per-model
MiB table) in whole 1 GiB units, rounded down as the device plugin counts it. The B1 arrival
stream (seed 0, CPU-only pods left out: they never reach the extender) becomes GPU pods: a share
of ``gpu_milli`` asks for that fraction of its card's memory rounded up, a whole-GPU pod for all
of it on each of its GPUs with the ``aliyun.com/gpu-count`` label. The card is the first model
of the pod's ``gpu_spec``, or the cluster's most common model when the pod names none.

Each policy gets a fresh API, cache and extender served by uvicorn on 127.0.0.1 (a real socket),
in the same process and event loop as the httpx client, so the round trip includes the
client's JSON work. The cache runs its list-then-watch task as in production, so the
fragmentation-aware policies learn the workload from the pods it sees. For each pod: POST
/filter with every node name (``nodeCacheCapable``), POST /prioritize with the names that
passed, pick the best score (ties to the first), POST /bind. Creating the pod in the API is not
timed. ``--transport asgi`` drives the app through httpx's ASGITransport instead (no socket).

``--names all`` (the default) sends every node name to filter, as B3 asks; ``--names sample``
sends what kube-scheduler itself would at that size: ``numFeasibleNodesToFind`` names (its
adaptive ``percentageOfNodesToScore``: 50 % - 1 % per 125 nodes, at least 5 % and 100 nodes),
taken round-robin from where the previous pod stopped (its other plugins assumed to pass all).

Reported per policy: p50 / p99 / max of the per-pod round trip in ms, the p50 of the time spent
inside the app for the pod's three calls (the extender's own work, FastAPI's parsing and
writing included; the rest is uvicorn, the socket and the client), pods/s (pods / summed round
trips), pods bound, and pods/s as a ratio to binpack measured in the same run.

    .venv/bin/python benchmarks/extender_http_speed.py [--replicas 1 4] [--pods 2000] \
        [--names all|sample] [--transport http|asgi]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import operator
import socket
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from gpushare.core.scheduling import Scheduler, Settings
from gpushare.extender.app import create_app
from gpushare.extender.service import Extender
from gpushare.kube.cache import ClusterCache
from gpushare.kube.memory import MemoryKube
from gpushare.kube.objects import gpu_node, gpu_pod
from gpushare.sim import synthetic
from gpushare.sim.openb import MILLI_PER_GPU, TraceNode, TracePod, read_nodes, read_pods
from gpushare.sim.stream import arrival_stream

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "openb"
CARD_MIB = {
    "T4": 15109,
    "V100M16": 16160,
    "P100": 16280,
    "A10": 22731,
    "V100M32": 32510,
    "G2": 20000,
    "G3": 30000,
}
"""BENCHMARKS.md's per-model memory."""
MIB_PER_UNIT = 1024
by_score = operator.itemgetter("Score")


def card_units(model: str) -> int:
    """A card's memory in 1 GiB units, rounded down as the device plugin counts it."""
    try:
        return CARD_MIB[model] // MIB_PER_UNIT
    except KeyError:
        raise SystemExit(
            f"error: model={model!r} has no memory in the per-model table "
            f"({', '.join(CARD_MIB)}); add it to CARD_MIB"
        ) from None


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
        per_gpu = math.ceil(pod.gpu_milli * CARD_MIB[model] / MILLI_PER_GPU / MIB_PER_UNIT)
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


class Timed:
    """ASGI middleware adding up the time requests spend inside the app."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seconds = 0.0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        start = time.perf_counter()
        try:
            await self.app(scope, receive, send)
        finally:
            self.seconds += time.perf_counter() - start


@dataclass
class Measured:
    """One policy's round trips."""

    pods: int
    bound: int
    app_p50_ms: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    pods_per_s: float


async def _post(client: httpx.AsyncClient, verb: str, body: bytes) -> Any:
    response = await client.post(
        f"/{verb}", content=body, headers={"content-type": "application/json"}
    )
    response.raise_for_status()
    return response.json()


async def measure(
    policy: str,
    nodes: Sequence[TraceNode],
    stream: Sequence[dict[str, Any]],
    transport: str,
    sample: int = 0,
) -> Measured:
    """Schedule the stream through a fresh extender with one policy."""
    kube = MemoryKube()
    for node in nodes:
        units = card_units(node.model)
        kube.put_node(gpu_node(node.name, gpus_units=[units] * node.gpus, model=node.model))
    settings = Settings(policy=policy)
    scheduler = Scheduler(settings)
    cache = ClusterCache(kube, settings=settings, workload=scheduler.workload)
    app = Timed(create_app(Extender(api=kube, cache=cache, scheduler=scheduler), run_cache=True))
    server: uvicorn.Server | None = None
    serving: asyncio.Task[None] | None = None
    cache_task: asyncio.Task[None] | None = None
    if transport == "http":
        # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets that say so, and
        # without it small writes wait for the peer's delayed ACK (about 40 ms a call), as
        # they would not with uvicorn binding host and port itself
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
        server = uvicorn.Server(config)
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            await asyncio.sleep(0.01)
        # Go's net/http (kube-scheduler) sets TCP_NODELAY too
        nodelay = httpx.AsyncHTTPTransport(
            socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
        )
        client = httpx.AsyncClient(
            transport=nodelay, base_url=f"http://127.0.0.1:{port}", trust_env=False
        )
    else:
        cache_task = asyncio.create_task(cache.run())
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://extender"
        )
    while not cache.synced:
        await asyncio.sleep(0.01)
    all_names = [n.name for n in nodes]
    names_json = json.dumps(all_names).encode()
    latencies: list[float] = []
    inside: list[float] = []
    bound = 0
    offset = 0
    try:
        for obj in stream:
            pod = kube.create_pod(obj)
            pod_json = json.dumps(pod).encode()
            if sample:
                window = [all_names[(offset + i) % len(all_names)] for i in range(sample)]
                offset = (offset + sample) % len(all_names)
                names_json = json.dumps(window).encode()
            before = app.seconds
            start = time.perf_counter()
            filtered = await _post(
                client, "filter", b'{"Pod":' + pod_json + b',"NodeNames":' + names_json + b"}"
            )
            passing = filtered.get("NodeNames") or []
            if passing:
                body = b'{"Pod":' + pod_json + b',"NodeNames":' + json.dumps(passing).encode()
                scores = await _post(client, "prioritize", body + b"}")
                best = max(scores, key=by_score)["Host"]
                meta = pod["metadata"]
                result = await _post(
                    client,
                    "bind",
                    json.dumps(
                        {
                            "PodName": meta["name"],
                            "PodNamespace": meta["namespace"],
                            "PodUID": meta["uid"],
                            "Node": best,
                        }
                    ).encode(),
                )
                bound += not result.get("Error")
            latencies.append(time.perf_counter() - start)
            inside.append(app.seconds - before)
    finally:
        await client.aclose()
        if server is not None and serving is not None:
            server.should_exit = True
            await serving
        elif cache_task is not None:
            cache_task.cancel()
    ordered = sorted(latencies)
    return Measured(
        pods=len(ordered),
        bound=bound,
        app_p50_ms=statistics.median(inside) * 1e3,
        p50_ms=statistics.median(ordered) * 1e3,
        p99_ms=ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1e3,
        max_ms=ordered[-1] * 1e3,
        pods_per_s=len(ordered) / sum(ordered),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--pods", type=int, default=2000, help="GPU pods per run; 0: all")
    parser.add_argument("--names", choices=("all", "sample"), default="all")
    parser.add_argument("--policy", action="append", help="repeatable; binpack always runs")
    parser.add_argument("--transport", choices=("http", "asgi"), default="http")
    args = parser.parse_args()
    policies = args.policy or ["binpack", "fgd", "gpushare"]
    policies = ["binpack", *(p for p in policies if p != "binpack")]
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
        print(
            f"\n{len(nodes)} nodes ({gpus} GPUs, {source}, x{k}), {len(stream)} GPU pods, "
            f"{sent}, transport={args.transport}"
        )
        print(
            "| policy | pods | bound | p50 ms | p99 ms | max ms | in app p50 ms | pods/s | "
            "ratio to binpack |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        reference = 0.0
        for name in policies:
            result = asyncio.run(measure(name, nodes, stream, args.transport, sample))
            reference = reference or result.pods_per_s
            print(
                f"| {name} | {result.pods} | {result.bound} | {result.p50_ms:.2f} | "
                f"{result.p99_ms:.2f} | {result.max_ms:.2f} | {result.app_p50_ms:.2f} | "
                f"{result.pods_per_s:.0f} | "
                f"{result.pods_per_s / reference:.2f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
