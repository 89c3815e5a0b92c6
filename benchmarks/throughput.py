"""Scheduling throughput on the real control plane, staged: plain pods against GPU pods.

For each node count it starts the e2e harness's control plane (``harness/cluster.py``: etcd,
kube-apiserver, kube-controller-manager, kube-scheduler, ``gpushare extender``, kwok), makes
that many kwok nodes of 8 x 15 GiB GPUs (``cgpu``), and runs two stages with the method of
``harness/staged.py`` (every pod created while kube-scheduler is stopped, then timed from the
first bind to the last):

1. plain pods (``100m`` CPU, no GPU) on the ``default-scheduler`` profile;
2. GPU pods (``100m`` CPU and 1-12 GiB of ``aliyun.com/gpu-mem``, seeded) on the
   ``ack-co-scheduler`` profile, through the extender.

It prints, per node count: both rates and their ratio (GPU over plain), kube-scheduler's
retries, the extender's binds by outcome, its p50/p99 per route, the CPU share of each
process, how long the extender, kube-scheduler and kube-apiserver waited for a free core per
GPU pod (``harness.staged.run_delay_seconds``), and the packing (GPUs touched, their mean
fill). ``--profile`` also samples the extender during the GPU stage and prints its hottest
frames: with py-spy where it is installed, else from inside (``benchmarks/sampler.py``), with
the innermost frames too.

    python benchmarks/throughput.py [--nodes 1000 5000] [--pods 5000] [--seed 2026]
                                    [--percentage 100] [--plain-percentage P] [--profile]
                                    [--extender gpushare|null] [--node-lease S]
                                    [--out throughput-out]

``--percentage`` sets the GPU profile's ``percentageOfNodesToScore`` (the chart's
``scheduler.percentageOfNodesToScore``; 100 by default, 0 for kube-scheduler's adaptive
sample); the default profile keeps kube-scheduler's own unless ``--plain-percentage`` sets
it: with 100 the plain stage is kube-scheduler filtering and scoring every node with no
extender at all. ``--extender null`` serves ``benchmarks/null_extender.py`` on the extender's
port: the same server, wire format and binding client with no decision at all, so its GPU rate
is the floor of the round trip.

Plain pods go first, so the GPU stage runs with the plain pods in every cache: if anything,
that is against the extender. kwok's stage that turns pods Running is off: nothing here reads
a pod's phase, and its status writes would load the API server alike in both stages.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpushare.schedconfig import (  # noqa: E402
    PERCENTAGE_OF_NODES_TO_SCORE,
    check_percentage,
    scheduler_configuration,
)
from harness.cluster import running_cluster  # noqa: E402
from harness.helpers import per_gpu_memory  # noqa: E402
from harness.staged import (  # noqa: E402
    Stage,
    gpu_nodes,
    run_stage,
    stage_pods,
)

VENV_BIN = Path(sys.executable).parent
NULL_EXTENDER = REPO / "benchmarks" / "null_extender.py"
SAMPLER = REPO / "benchmarks" / "sampler.py"
GPU_UNITS = 15
LABEL = "throughput"


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def packing(items: list[dict[str, Any]]) -> dict[str, Any]:
    held = per_gpu_memory(items)
    total = sum(held.values())
    return {
        "gpus_touched": len(held),
        "mean_fill": round(total / (len(held) * GPU_UNITS), 3) if held else 0.0,
        "over_committed": sum(1 for v in held.values() if v > GPU_UNITS),
    }


def _stacks(raw: Path) -> Counter[str]:
    counts: Counter[str] = Counter()
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():  # not py-spy's own messages
            counts[stack] += int(count)
    return counts


def hottest(raw: Path, top: int = 25, *, innermost: bool = False) -> list[tuple[str, float]]:
    """Collapsed stacks (py-spy's or ``sampler.py``'s) as (frame, share of samples that
    include it, or that end in it with ``innermost``), hottest first."""
    counts = _stacks(raw)
    shares: Counter[str] = Counter()
    total = 0
    for stack, n in counts.items():
        if n <= 0:
            continue
        total += n
        frames = stack.split(";")
        for frame in [frames[-1]] if innermost else set(frames):
            shares[frame] += n
    return [(frame, n / total) for frame, n in shares.most_common(top)] if total else []


def run(
    nodes: int,
    pods: int,
    seed: int,
    out: Path,
    profile: bool,
    percentage: int,
    plain_percentage: int | None = None,
    extender: str = "gpushare",
    node_lease_s: int = 40,
    before: Path | None = None,
    tag: str = "",
) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix=f"gpushare-tp-{nodes}-"))
    profiles = {"profiles": scheduler_configuration(percentage=percentage)["profiles"]}
    if plain_percentage is not None:
        [default] = [p for p in profiles["profiles"] if p["schedulerName"] == "default-scheduler"]
        default["percentageOfNodesToScore"] = plain_percentage
    try:
        with running_cluster(
            root,
            progress,
            pods_run=False,
            scheduler_settings=profiles,
            node_lease_s=node_lease_s,
        ) as cluster:
            raw = out / f"profile-{nodes}{tag}.txt"
            py_spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(VENV_BIN))
            if extender == "null":
                cluster.start_extender(progress, command=[sys.executable, str(NULL_EXTENDER)])
            elif extender == "before":  # gpushare from another source tree
                cluster.start_extender(progress, wrapper=["env", f"PYTHONPATH={before}"])
            elif profile and not py_spy:  # sampled from inside (benchmarks/sampler.py)
                raw.unlink(missing_ok=True)
                cluster.start_extender(progress, wrapper=[sys.executable, str(SAMPLER), str(raw)])
            names = [f"tp-{i:05d}" for i in range(nodes)]
            progress(f"creating {nodes} kwok nodes")
            gpu_nodes(cluster, names, LABEL)
            plain_pods, gpu_pods = stage_pods(
                pods,
                seed,
                {"gpushare-e2e": LABEL},
                gpu_namespace="tp-gpu",
                plain_namespace="tp-plain",
            )
            plain = run_stage(
                cluster, "plain", "tp-plain", plain_pods, gpu=False, progress=progress
            )
            spy = None
            inside = profile and not py_spy and extender == "gpushare"
            profile = profile and extender == "gpushare"
            pid = cluster.processes["gpushare-extender"].pid
            if profile and py_spy:
                spy = subprocess.Popen(
                    [
                        py_spy,
                        "record",
                        "--pid",
                        str(cluster.processes["gpushare-extender"].pid),
                        "--format",
                        "raw",
                        "--rate",
                        "200",
                        "--output",
                        str(raw),
                        "--nonblocking",
                        # only the thread holding the GIL: a wall-clock sample also counts
                        # the time a socket write waits for the CPU after waking its reader
                        "--gil",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=(out / f"py-spy-{nodes}{tag}.log").open("wb"),
                )
            gpu = run_stage(
                cluster,
                "gpu",
                "tp-gpu",
                gpu_pods,
                gpu=True,
                progress=progress,
                timeout=1800,
                # the sampler counts from kube-scheduler's start
                on_start=(lambda: os.kill(pid, signal.SIGUSR1)) if inside else None,
            )
            if spy is not None:
                spy.send_signal(2)
                spy.wait(timeout=60)
            items = cluster.kubectl_json("get", "pods", "-n", "tp-gpu")["items"]
            result = {
                "nodes": nodes,
                "pods": pods,
                "percentage_of_nodes_to_score": percentage,
                "plain_percentage_of_nodes_to_score": plain_percentage,
                "extender": extender,
                "plain": plain.as_dict(),
                "gpu": gpu.as_dict(),
                "ratio": round(gpu.pods_per_second / plain.pods_per_second, 3)
                if plain.pods_per_second
                else 0.0,
                "packing": packing(items),
            }
            if inside:
                time.sleep(6)  # the sampler writes its counts every 5 s
            if (spy is not None or inside) and raw.exists():
                result["hottest"] = [(f, round(s, 3)) for f, s in hottest(raw)]
                result["innermost"] = [(f, round(s, 3)) for f, s in hottest(raw, innermost=True)]
            return result
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _routes(stage: Stage | dict[str, Any]) -> str:
    routes = stage["routes_ms"] if isinstance(stage, dict) else stage.routes_ms
    return " ".join(
        f"{route} {v.get('p50', '-')}/{v.get('p99', '-')}" for route, v in routes.items()
    )


def _scored(result: dict[str, Any]) -> str:
    """The GPU profile's percentageOfNodesToScore, the plain profile's when set, and the
    reference extender when it served."""
    gpu = result.get("percentage_of_nodes_to_score", 100)
    plain = result.get("plain_percentage_of_nodes_to_score")
    text = str(gpu) if plain is None else f"{gpu} (plain {plain})"
    extender = result.get("extender", "gpushare")
    if extender == "null":
        return f"{text}, null extender"
    if extender == "before":
        return f"{text}, gpushare from {result.get('before', '?')}"
    return text


def against_null(results: list[dict[str, Any]]) -> None:
    """Give each result of a round its GPU rate over the null extender's in the same round."""
    for r in results:
        null = [
            x
            for x in results
            if x["extender"] == "null" and x["nodes"] == r["nodes"] and x["round"] == r["round"]
        ]
        if null and null[0]["gpu"]["pods_per_second"]:
            r["to_null"] = round(r["gpu"]["pods_per_second"] / null[0]["gpu"]["pods_per_second"], 3)


def table(results: list[dict[str, Any]]) -> str:
    """The results as a Markdown table, one row per node count."""
    head = (
        "| nodes | % scored | pods | plain pods/s | GPU pods/s | ratio | retries (GPU) "
        "| binds by outcome | extender ms p50/p99 "
        "| CPU share: extender / scheduler / apiserver / etcd "
        "| waited for a CPU, ms a GPU pod: extender / scheduler / apiserver | GPUs touched "
        "| mean fill | GPU rate to null's | load average |\n|" + "---|" * 15
    )
    rows = []
    for r in results:
        gpu = r["gpu"]
        cpu = gpu["cpu_share"]
        wait = gpu.get("run_wait_ms", {})
        rows.append(
            f"| {r['nodes']} | {_scored(r)} | {r['pods']} "
            f"| {r['plain']['pods_per_second']} "
            f"| {gpu['pods_per_second']} | {r['ratio']} | {gpu['retries']:.0f} "
            f"| {', '.join(f'{k} {v:.0f}' for k, v in sorted(gpu['binds'].items()))} "
            f"| {_routes(gpu)} "
            f"| {cpu.get('gpushare-extender', 0):.2f} / {cpu.get('kube-scheduler', 0):.2f} / "
            f"{cpu.get('kube-apiserver', 0):.2f} / {cpu.get('etcd', 0):.2f} "
            f"| {wait.get('gpushare-extender', 0):.2f} / {wait.get('kube-scheduler', 0):.2f} / "
            f"{wait.get('kube-apiserver', 0):.2f} "
            f"| {r['packing']['gpus_touched']} | {r['packing']['mean_fill']} "
            f"| {r.get('to_null', '-')} | {r.get('load', '-')} |"
        )
    return "\n".join([head, *rows])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument(
        "--percentage",
        type=int,
        default=PERCENTAGE_OF_NODES_TO_SCORE,
        help="the GPU profile's percentageOfNodesToScore (0..100)",
    )
    parser.add_argument(
        "--plain-percentage",
        type=int,
        default=None,
        help="the default profile's percentageOfNodesToScore (0..100; kube-scheduler's own "
        "when not given)",
    )
    parser.add_argument(
        "--extender",
        choices=["gpushare", "null", "before"],
        nargs="+",
        default=["gpushare"],
        help="null: serve benchmarks/null_extender.py instead, which decides nothing (the "
        "floor of the round trip; its packing means nothing); before: gpushare from --before; "
        "several run one after another on a fresh cluster each, in the order given",
    )
    parser.add_argument(
        "--before",
        type=Path,
        default=None,
        help="a source tree (its src/ folder, from git archive) served as --extender before",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the --extender list this many times over; each round's rates are also "
        "given over the null extender's of the same round",
    )
    parser.add_argument(
        "--node-lease",
        type=int,
        default=40,
        help="kwok's node lease in seconds; a longer one keeps nodes Ready on cores too busy "
        "to renew 1,000 leases in time",
    )
    parser.add_argument("--profile", action="store_true", help="sample the extender with py-spy")
    parser.add_argument("--out", type=Path, default=Path("throughput-out"))
    args = parser.parse_args(argv)
    for name, value, low in (("--pods", args.pods, 2), *(("--nodes", n, 1) for n in args.nodes)):
        if value < low:
            parser.error(f"{name} {value} is too small: give at least {low}")
    for flag, value in (
        ("--percentage", args.percentage),
        ("--plain-percentage", args.plain_percentage),
    ):
        try:
            if value is not None:
                check_percentage(value)
        except ValueError as err:
            parser.error(f"{flag}: {err}")
    if "before" in args.extender and (args.before is None or not args.before.is_dir()):
        parser.error(f"--extender before needs --before SRC, a source folder (got {args.before})")
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds} is too small: give at least 1")
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for nodes in args.nodes:
        for round_ in range(args.rounds):
            for extender in args.extender:
                tag = f"-{extender}-{round_}" if len(args.extender) > 1 or args.rounds > 1 else ""
                load = " ".join(f"{x:.1f}" for x in os.getloadavg())
                result = run(
                    nodes,
                    args.pods,
                    args.seed,
                    args.out,
                    args.profile,
                    args.percentage,
                    args.plain_percentage,
                    extender,
                    args.node_lease,
                    args.before,
                    tag,
                )
                result["round"] = round_
                result["load"] = f"{load} / {' '.join(f'{x:.1f}' for x in os.getloadavg())}"
                if extender == "before":
                    result["before"] = str(args.before)
                results.append(result)
                print(json.dumps(result), flush=True)
                (args.out / f"throughput-{nodes}{tag}.json").write_text(
                    json.dumps(result, indent=2)
                )
    against_null(results)
    print(table(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
