"""The extender's memory and filter latency at a cluster's size, on the real control plane.

For each node count it starts the e2e harness's control plane (``harness/cluster.py``: etcd,
kube-apiserver, kube-controller-manager, kube-scheduler, ``gpushare extender``, kwok), makes
that many kwok nodes of 8 x 15 GiB GPUs, and fills it step by step to each pod count, half of
the pods plain (``100m`` CPU) and half GPU pods (``100m`` and 1-4 GiB of
``aliyun.com/gpu-mem``). At each step it prints:

- ``load_peak_mib``: the extender's peak RSS (``VmHWM``) while it watched the step's pods
  arrive and bind;
- ``peak_mib``: the peak of a fresh extender started on the full cluster (its first list of
  every node and pod is the moment it needs the most), measured after the probe below;
- ``rss_mib``: its RSS after the probe (what it holds at rest);
- filter p50/p99 (the extender's own histogram) over a probe of GPU pods scheduled with
  kube-scheduler scoring every node, the chart's default, so each filter call carries all
  nodes.

How the pods get there, the fastest honest way on two cores: plain pods are created already
bound (``spec.nodeName``, round robin over the nodes), which is what the extender sees of a
pod kube-scheduler placed; GPU pods go through kube-scheduler and the extender's bind (their
allocations must be the extender's own, sealed), staged (``harness/staged.py``) with
kube-scheduler's adaptive sample to load them quickly, then the probe with every node scored.
The probe's pods count in the step's total. ``--compare SRC...`` also starts, at each step,
one extender more from each source tree given (``git archive <commit> src``), which lists and
watches the same objects and serves nothing, and prints its peak: two builds on one cluster.

    python benchmarks/sizing.py [--nodes 1000 5000] [--pods 10000 50000] [--probe 500]
                                [--seed 2026] [--out sizing-out] [--compare SRC ...]

Big runs (more than 1,000 nodes) belong under ``flock /tmp/gpushare-big.lock``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpushare.schedconfig import PERCENTAGE_OF_NODES_TO_SCORE, scheduler_configuration  # noqa: E402
from harness.cluster import Cluster, running_cluster  # noqa: E402
from harness.helpers import gpu_pod_manifest  # noqa: E402
from harness.staged import Stage, create_in_parallel, gpu_nodes, run_stage  # noqa: E402

LABEL = "sizing"
SIZES = [1, 1, 2, 2, 3, 4]
"""GiB per GPU pod, drawn uniformly: small enough that 25,000 of them fit 1,000 nodes."""


NODE_LEASE_S = 600
"""kwok's node lease: thousands of nodes renewing a 40 s lease on two busy cores fall behind,
and a node whose lease ran out turns NotReady and takes no pods. Nothing here measures
heartbeats, so they come rarely."""


CREATE_TIMEOUT_S = 3600
"""How long creating one batch of objects (the nodes, a step's plain pods) may take: posted
concurrently, 5,000 nodes or 25,000 pods take minutes on two shared cores, not the hour."""


def progress(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


def memory_mib(pid: int) -> dict[str, float]:
    """The process's peak (``VmHWM``) and current (``VmRSS``) resident memory, in MiB."""
    values = {}
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            key, _, rest = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                values[key] = round(int(rest.split()[0]) / 1024, 1)
    return values


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def fresh_peak(root: Path, src: Path, timeout: float = 900) -> float:
    """The peak RSS (MiB) of one more extender, run from the sources under ``src``, on the
    cluster under ``root`` (the harness's files), once it has listed everything.

    It serves nothing kube-scheduler calls; it lists and watches like the one that does, so
    two builds are compared on the very same objects.
    """
    port = _free_port()
    argv = [
        str(Path(sys.executable).parent / "gpushare"),
        "extender",
        "--kubeconfig",
        str(root / "admin.kubeconfig"),
        "--port",
        str(port),
        "--seal-key-file",
        str(root / "seal.key"),
        "--log-level",
        "warning",
    ]
    env = {**os.environ, "PYTHONPATH": str(src)}
    process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"the extender from {src} ended: {process.stderr}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5):
                    break
            except OSError:
                time.sleep(1)
        else:
            raise RuntimeError(f"the extender from {src} was not ready in {timeout:.0f}s")
        time.sleep(2)
        return memory_mib(process.pid)["VmHWM"]
    finally:
        process.terminate()
        process.wait(timeout=60)


def profiles(percentage: int) -> dict[str, Any]:
    """The scheduler's profiles with the GPU profile scoring ``percentage`` of the nodes."""
    return {"profiles": scheduler_configuration(percentage=percentage)["profiles"]}


def plain_pods(start: int, count: int, namespace: str, nodes: list[str]) -> list[dict[str, Any]]:
    """Plain pods created bound, round robin over ``nodes``."""
    pods = []
    for i in range(start, start + count):
        pod = gpu_pod_manifest(f"c{i:05d}", namespace, 1, selector={"gpushare-e2e": LABEL})
        pod["spec"]["schedulerName"] = "default-scheduler"
        pod["spec"]["nodeName"] = nodes[i % len(nodes)]
        pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "100m"}}
        pods.append(pod)
    return pods


def gpu_pods(start: int, count: int, namespace: str, rng: random.Random) -> list[dict[str, Any]]:
    """GPU pods of 1-4 GiB (``SIZES``) for the ``ack-co-scheduler`` profile."""
    pods = []
    for i in range(start, start + count):
        pod = gpu_pod_manifest(
            f"g{i:05d}", namespace, rng.choice(SIZES), selector={"gpushare-e2e": LABEL}
        )
        pod["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "100m"}
        pods.append(pod)
    return pods


def gpu_stage(
    cluster: Cluster,
    name: str,
    namespace: str,
    start: int,
    count: int,
    rng: random.Random,
    timeout: float = 900,
) -> Stage:
    """Schedule ``count`` new GPU pods through kube-scheduler and the extender, staged."""
    pods = gpu_pods(start, count, namespace, rng)
    return run_stage(cluster, name, namespace, pods, gpu=True, progress=progress, timeout=timeout)


def step(
    cluster: Cluster,
    names: list[str],
    total: int,
    loaded: dict[str, int],
    probe: int,
    rng: random.Random,
    compare: list[Path],
) -> dict[str, Any]:
    """Fill the cluster to ``total`` pods (``loaded`` counts what is there), restart the
    extender, probe filter with every node scored; return the figures."""
    n = len(names)
    plain_count = total // 2 - loaded["plain"]
    gpu_count = total - total // 2 - loaded["gpu"] - probe
    if plain_count < 0 or gpu_count < 0:
        raise ValueError(f"--pods {total} is too small after {loaded} and a probe of {probe}")
    namespace = f"plain-{total}"
    cluster.create_namespace(namespace)
    progress(f"[{n} nodes, {total} pods] creating {plain_count} bound plain pods")
    create_in_parallel(
        cluster,
        plain_pods(loaded["plain"], plain_count, namespace, names),
        timeout=CREATE_TIMEOUT_S,
        progress=progress,
    )
    loaded["plain"] += plain_count
    cluster.scheduler_settings = profiles(0)
    gpu_stage(cluster, "load", f"gpu-{total}", loaded["gpu"], gpu_count, rng, timeout=3600)
    loaded["gpu"] += gpu_count
    load = memory_mib(cluster.processes["gpushare-extender"].pid)
    compared = {}
    for src in compare:
        progress(f"[{n} nodes, {total} pods] a fresh extender from {src}")
        compared[str(src)] = fresh_peak(cluster.root, src)
    progress(f"[{n} nodes, {total} pods] restarting the extender on the full cluster")
    cluster.start_extender(progress, ready_timeout=900)
    cluster.scheduler_settings = profiles(PERCENTAGE_OF_NODES_TO_SCORE)
    stage = gpu_stage(cluster, "probe", f"probe-{total}", loaded["gpu"], probe, rng)
    loaded["gpu"] += probe
    fresh = memory_mib(cluster.processes["gpushare-extender"].pid)
    filter_ms = stage.routes_ms.get("filter", {})
    return {
        "nodes": n,
        "pods": total,
        "gpu_pods": loaded["gpu"],
        "plain_pods": loaded["plain"],
        "load_peak_mib": load["VmHWM"],
        "peak_mib": fresh["VmHWM"],
        "rss_mib": fresh["VmRSS"],
        "filter_p50_ms": filter_ms.get("p50"),
        "filter_p99_ms": filter_ms.get("p99"),
        "probe_pods_per_second": round(stage.pods_per_second, 1),
        "probe_cpu_share": {k: round(v, 2) for k, v in stage.cpu_share.items()},
        "fresh_peak_mib_by_source": compared,
    }


def run(
    nodes: int,
    totals: list[int],
    probe: int,
    seed: int,
    compare: list[Path],
    record: Callable[[dict[str, Any]], None] = lambda _: None,
) -> list[dict[str, Any]]:
    root = Path(tempfile.mkdtemp(prefix=f"gpushare-size-{nodes}-"))
    rng = random.Random(seed)
    try:
        with running_cluster(root, progress, pods_run=False, node_lease_s=NODE_LEASE_S) as cluster:
            names = [f"sz-{i:05d}" for i in range(nodes)]
            progress(f"creating {nodes} kwok nodes")
            gpu_nodes(cluster, names, LABEL, timeout=CREATE_TIMEOUT_S, progress=progress)
            loaded = {"plain": 0, "gpu": 0}
            results = []
            for total in sorted(totals):
                result = step(cluster, names, total, loaded, probe, rng, compare)
                print(json.dumps(result), flush=True)
                results.append(result)
                record(result)
            return results
    finally:
        shutil.rmtree(root, ignore_errors=True)


def table(results: list[dict[str, Any]]) -> str:
    """The results as a Markdown table."""
    rows = [
        "| nodes | pods (GPU / plain) | peak RSS MiB (fresh start) | RSS at rest MiB "
        "| peak RSS MiB while loading | filter p50 / p99 ms |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        rows.append(
            f"| {r['nodes']} | {r['pods']} ({r['gpu_pods']} / {r['plain_pods']}) "
            f"| {r['peak_mib']} | {r['rss_mib']} | {r['load_peak_mib']} "
            f"| {r['filter_p50_ms']} / {r['filter_p99_ms']} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--pods", type=int, nargs="+", default=[10000, 50000])
    parser.add_argument("--probe", type=int, default=500)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--out", type=Path, default=Path("sizing-out"))
    parser.add_argument(
        "--compare",
        type=Path,
        nargs="*",
        default=[],
        help="source trees (a src/ folder each) whose extender's fresh-start peak is measured "
        "on the same cluster at each step, for a before-and-after comparison",
    )
    args = parser.parse_args(argv)
    for n in args.nodes:
        if n < 1:
            parser.error(f"--nodes {n} is too small: give at least 1")
    for total in args.pods:
        if total < 2 * args.probe + 2:
            parser.error(f"--pods {total} is too small: give at least {2 * args.probe + 2}")
    args.out.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []

    def record(result: dict[str, Any]) -> None:  # each step as it ends: big runs take hours
        results.append(result)
        (args.out / "sizing.json").write_text(json.dumps(results, indent=2))

    for nodes in args.nodes:
        run(nodes, args.pods, args.probe, args.seed, args.compare, record)
    print(table(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
