"""What N device plugins' node loops ask of kube-apiserver: the old poll against the watch.

The real control plane (harness/cluster.py: etcd, kube-apiserver, kube-scheduler with the
extender, kube-controller-manager, kwok) with ``--nodes`` kwok GPU nodes (100 by default). For
each node, in this one process, runs what the device plugin runs to learn its node's pods and
mark them served, each with its own API client and its own PodResources socket answered by
``harness/podresources_double.py``:

- ``poll``: the plugin as it was up to 0.x (one ``LIST pods?fieldSelector=spec.nodeName`` and
  one PodResources ``List`` every ``check_interval``, 1 s), kept here as the reference;
- ``watch``: the plugin now (kube.podwatch's list and watch, reconcile's check on change).

Three phases of ``--seconds`` each (60 by default), in the same run: nothing running (what
kwok, kube-scheduler, kube-controller-manager and the extender ask by themselves), then each
mode at steady state (no pod changes). Each phase reads kube-apiserver's
``apiserver_request_total`` before and after and prints, by verb and resource, the requests per
node per minute beyond the idle phase's. A WATCH is counted when it ends, so the number of
watches open on pods (``apiserver_longrunning_requests``) is printed too.

Then, per mode, ``--pods`` GPU pods (1 GiB each) go through kube-scheduler and the extender to
distinct nodes; when a watch of the benchmark sees a pod bound, the node's double admits it
and the plugin is told Allocate answered (as the real plugin learns from its own Allocate). The
time from seeing it bound to seeing it marked served (``ALIYUN_COM_GPU_MEM_ASSIGNED``), both by
that same watch, is the reaction time; p50 and max are printed.

    python benchmarks/plugin_api_requests.py [--nodes 100] [--seconds 60] [--pods 20]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import ssl
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the harness lives in harness/
    sys.path.insert(0, str(ROOT))

from gpushare.core.model.names import ANN_ASSIGNED  # noqa: E402
from gpushare.core.records.handoff import MEM  # noqa: E402
from gpushare.core.records.trust import Trust  # noqa: E402
from gpushare.deviceplugin.allocating import NodeParts, NodeReader  # noqa: E402
from gpushare.deviceplugin.checkpoint import ServedCheckpoint  # noqa: E402
from gpushare.deviceplugin.config import PluginConfig, Stats  # noqa: E402
from gpushare.deviceplugin.kubelet.reconcile import ServedCheck  # noqa: E402
from gpushare.kube.lightkube_api import LightkubeAPI  # noqa: E402
from gpushare.kube.podwatch import NodePodWatch  # noqa: E402
from gpushare.kube.port import KubeError  # noqa: E402
from gpushare.kube.sealing import load_key_file  # noqa: E402
from gpushare.node.enforcement.hook import NoIsolation  # noqa: E402
from harness.cluster import Cluster, running_cluster  # noqa: E402
from harness.helpers import gpu_pod_manifest  # noqa: E402
from harness.podresources_double import PodResourcesDouble  # noqa: E402
from harness.seeding import kwok_node  # noqa: E402
from harness.staged import Samples, create_in_parallel, scrape  # noqa: E402

LABEL = "gpushare-bench"
NAMESPACE = "default"
MODES = ("poll", "watch")


class PollCheck(ServedCheck):
    """The served check as the plugin ran it before the watch: list and read every interval.

    Its loop, as it was: sleep ``check_interval``, list the node's pods, read PodResources;
    backing off only after failures.
    """

    async def run(self, resources: Sequence[str]) -> None:
        wait = self.config.check_interval
        while True:
            await self._sleep(wait)
            try:
                await self.check(resources)
            except KubeError:
                wait = max(self.config.check_interval, self.backoff.failed())
            else:
                self.backoff.reset()
                wait = self.config.check_interval


@dataclass
class NodeLoop:
    """One node's plugin side that learns the node's pods and marks them served."""

    node: str
    api: LightkubeAPI
    double: PodResourcesDouble
    check: ServedCheck
    watch: NodePodWatch | None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def start(self) -> None:
        if self.watch is not None:
            self.tasks.append(asyncio.create_task(self.watch.run()))
        self.tasks.append(asyncio.create_task(self.check.run([MEM])))

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.double.stop()
        await self.api.close()


async def node_loop(cluster: Cluster, node: str, mode: str, work: Path, trust: Trust) -> NodeLoop:
    api = LightkubeAPI.connect(str(cluster.kubeconfig))
    socket = work / f"{node}.sock"
    double = PodResourcesDouble(socket)
    await double.start()
    config = PluginConfig(
        node=node, pod_resources_socket=socket, state_dir=work, check_interval=1.0
    )
    stats = Stats()
    parts = NodeParts(
        api=api,
        config=config,
        hook=NoIsolation(),
        checkpoint=ServedCheckpoint(work / f"served-{node}-{mode}.json"),
        stats=stats,
        pods=NodeReader(api=api, config=config, trust=trust, stats=stats),
    )
    if mode == "poll":
        return NodeLoop(node, api, double, PollCheck(parts), None)
    watch = NodePodWatch(api, node, on_change=parts.changed.set)
    return NodeLoop(node, api, double, ServedCheck(parts, watch=watch), watch)


def metrics_context(cluster: Cluster) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(cluster.pki / "ca.crt"))
    context.load_cert_chain(str(cluster.pki / "admin.crt"), str(cluster.pki / "admin.key"))
    return context


def requests_by(samples: Samples) -> dict[tuple[str, str], float]:
    """``apiserver_request_total`` summed by (verb, resource/subresource)."""
    out: dict[tuple[str, str], float] = {}
    for (name, labels), value in samples.items():
        if name != "apiserver_request_total":
            continue
        found = dict(labels)
        resource = found.get("resource", "")
        if found.get("subresource"):
            resource += "/" + found["subresource"]
        key = (found.get("verb", ""), resource)
        out[key] = out.get(key, 0.0) + value
    return out


def open_pod_watches(samples: Samples) -> float:
    return sum(
        value
        for (name, labels), value in samples.items()
        if name == "apiserver_longrunning_requests"
        and dict(labels).get("verb") == "WATCH"
        and dict(labels).get("resource") == "pods"
    )


@dataclass
class Phase:
    name: str
    seconds: float
    requests: dict[tuple[str, str], float]
    open_watches: float


async def measure(cluster: Cluster, name: str, seconds: float) -> Phase:
    url = f"{cluster.server}/metrics"
    context = metrics_context(cluster)
    before = await asyncio.to_thread(scrape, url, context)
    started = time.monotonic()
    await asyncio.sleep(seconds)
    after = await asyncio.to_thread(scrape, url, context)
    took = time.monotonic() - started
    first, last = requests_by(before), requests_by(after)
    delta = {k: last.get(k, 0.0) - first.get(k, 0.0) for k in set(first) | set(last)}
    return Phase(name, took, delta, open_pod_watches(after))


def per_node_minute(phase: Phase, idle: Phase, nodes: int) -> dict[tuple[str, str], float]:
    """Requests per node per minute beyond the idle phase's rate."""
    out = {}
    for key in set(phase.requests) | set(idle.requests):
        rate = phase.requests.get(key, 0.0) / phase.seconds
        base = idle.requests.get(key, 0.0) / idle.seconds
        value = (rate - base) * 60 / nodes
        if abs(value) >= 0.005:
            out[key] = value
    return out


@contextlib.asynccontextmanager
async def running_loops(
    cluster: Cluster, names: list[str], mode: str, work: Path, trust: Trust
) -> AsyncIterator[dict[str, NodeLoop]]:
    loops = {n: await node_loop(cluster, n, mode, work, trust) for n in names}
    for loop in loops.values():
        loop.start()
    try:
        yield loops
    finally:
        for loop in loops.values():
            await loop.stop()


async def reaction_times(
    cluster: Cluster, loops: dict[str, NodeLoop], mode: str, count: int
) -> list[float]:
    """Seconds from a pod seen bound to it seen marked served, for ``count`` pods."""
    api = LightkubeAPI.connect(str(cluster.kubeconfig))
    _, version = await api.list_pods()
    bound: dict[str, float] = {}
    served: dict[str, float] = {}
    names = list(loops)[:count]
    targets = {f"react-{mode}-{i}": node for i, node in enumerate(names)}

    async def follow() -> None:
        async for event in api.watch_pods(version):
            pod = event.object
            name = pod["metadata"]["name"]
            node = pod.get("spec", {}).get("nodeName")
            if name not in targets or not node or event.type == "DELETED":
                continue
            now = time.monotonic()
            if name not in bound:
                bound[name] = now
                loop = loops[node]
                loop.double.admit(pod, "aliyun.com/gpu-mem")
                loop.check.changed.set()  # what the plugin's own Allocate answer does
            annotations = pod["metadata"].get("annotations") or {}
            if annotations.get(ANN_ASSIGNED) == "true" and name not in served:
                served[name] = now

    follower = asyncio.create_task(follow())
    manifests = [
        gpu_pod_manifest(name, NAMESPACE, 1, selector={"kubernetes.io/hostname": node})
        for name, node in targets.items()
    ]
    await asyncio.to_thread(create_in_parallel, cluster, manifests)
    deadline = time.monotonic() + 120
    while len(served) < len(targets) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    follower.cancel()
    with contextlib.suppress(asyncio.CancelledError, KubeError):
        await follower
    await api.close()
    missing = sorted(set(targets) - set(served))
    if missing:
        print(f"  {mode}: {len(missing)} pods never marked served: {missing[:5]}", flush=True)
    await asyncio.to_thread(
        cluster.kubectl, "delete", "pods", *targets, "-n", NAMESPACE, "--wait=false"
    )
    for name, node in targets.items():
        loops[node].double.forget(NAMESPACE, name)
    return [served[n] - bound[n] for n in served]


SHOWN = 0.05
"""Rows below this many requests per node per minute in every mode are summed as one."""


def table(rows: dict[str, dict[tuple[str, str], float]]) -> None:
    keys = sorted({k for r in rows.values() for k in r}, key=lambda k: (k[1], k[0]))
    shown = [k for k in keys if any(abs(r.get(k, 0.0)) >= SHOWN for r in rows.values())]
    print(f"  {'verb':<8} {'resource':<22}" + "".join(f"{m:>10}" for m in rows))
    for verb, resource in shown:
        cells = "".join(f"{rows[m].get((verb, resource), 0.0):>10.2f}" for m in rows)
        print(f"  {verb:<8} {resource:<22}{cells}")
    rest = "".join(
        f"{sum(v for k, v in r.items() if k not in shown):>10.2f}" for r in rows.values()
    )
    print(f"  {'others':<8} {f'(each < {SHOWN})':<22}{rest}")
    totals = "".join(f"{sum(r.values()):>10.2f}" for r in rows.values())
    print(f"  {'all':<8} {'':<22}{totals}")


async def bench(cluster: Cluster, nodes: int, seconds: float, pods: int) -> None:
    names = [f"bench-{i:04d}" for i in range(nodes)]
    manifests = [kwok_node(n, gpus_units=[15]) for n in names]
    for node in manifests:
        node["metadata"]["labels"][LABEL] = "yes"
    started = time.monotonic()
    await asyncio.to_thread(cluster.create_nodes, manifests, 600)
    print(f"{nodes} kwok nodes Ready in {time.monotonic() - started:.1f}s", flush=True)
    trust = Trust.sealed(load_key_file(cluster.seal_key))
    work = Path(tempfile.mkdtemp(prefix="gs-bench-", dir="/tmp"))
    try:
        await asyncio.sleep(10)  # the nodes' registration Events and first leases are written
        idle = await measure(cluster, "idle", seconds)
        print(
            f"idle: {sum(idle.requests.values()):.0f} requests in {idle.seconds:.0f}s", flush=True
        )
        rows: dict[str, dict[tuple[str, str], float]] = {}
        reactions: dict[str, list[float]] = {}
        watches: dict[str, float] = {}
        reads: dict[str, float] = {}
        for mode in MODES:
            async with running_loops(cluster, names, mode, work, trust) as loops:
                await asyncio.sleep(5)  # every loop has listed (and opened its watch)
                before = sum(loop.double.lists for loop in loops.values())
                phase = await measure(cluster, mode, seconds)
                done = sum(loop.double.lists for loop in loops.values()) - before
                reads[mode] = done * 60 / phase.seconds / nodes
                rows[mode] = per_node_minute(phase, idle, nodes)
                watches[mode] = phase.open_watches
                reactions[mode] = await reaction_times(cluster, loops, mode, pods)
                print(f"{mode}: done", flush=True)
        print()
        print(f"kube-apiserver requests per node per minute at steady state ({nodes} nodes, ")
        print(f"{seconds:.0f}s per phase, beyond the idle phase; apiserver_request_total):")
        table(rows)
        opened = ", ".join(f"{m} {watches[m] - idle.open_watches:.0f}" for m in MODES)
        print(f"  WATCH requests on pods open at the end of the phase, beyond idle: {opened}")
        per_node = ", ".join(f"{m} {reads[m]:.2f}" for m in MODES)
        print(f"  PodResources List calls per node per minute: {per_node}")
        print()
        print("seconds from a pod seen bound to it seen marked served:")
        for mode in MODES:
            times = reactions[mode]
            if times:
                print(
                    f"  {mode:<6} pods {len(times):>3}  p50 {statistics.median(times):.2f}  "
                    f"max {max(times):.2f}"
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100, help="kwok nodes, one loop each")
    parser.add_argument("--seconds", type=float, default=60.0, help="length of each phase")
    parser.add_argument("--pods", type=int, default=20, help="pods timed per mode")
    args = parser.parse_args(argv)
    if args.nodes < 1 or args.seconds <= 0 or not 0 < args.pods <= args.nodes:
        parser.error(
            f"--nodes {args.nodes}, --seconds {args.seconds}, --pods {args.pods}: need "
            "nodes >= 1, seconds > 0 and 0 < pods <= nodes (one timed pod per node)"
        )
    root = Path(tempfile.mkdtemp(prefix="gs-bench-cluster-", dir="/tmp"))
    try:
        with running_cluster(root, progress=lambda s: print(f"starting {s}", flush=True)) as c:
            asyncio.run(bench(c, args.nodes, args.seconds, args.pods))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
