"""``make cluster``: a control plane on 127.0.0.1 for a person, with the seeds' nodes.

    python -m harness.clusterctl up [--dir .cluster] [--unit 1GiB|128MiB] [--real-node]
    python -m harness.clusterctl down [--dir .cluster]

``up`` starts the control plane (``cluster.py``), creates the seeds' GPU nodes as kwok nodes
(``seeding.py``) and the seal key's Secret, so the seed walkthrough runs with plain kubectl at
once, and with ``--real-node`` one real node (``realnode.py``). ``down`` stops what actually
runs for the directory, found by command line (``reaping.py``), not only what ``pids`` recorded.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from gpushare.core.model.units import MemoryUnit
from gpushare.kube.sealing import DEFAULT_SECRET, SECRET_FIELD
from harness.cluster import REPO, Cluster, StartError, build_binaries
from harness.images import TEST_IMAGE
from harness.realnode import RealNode, clean_up_stopped, unavailable
from harness.reaping import find_running, stop
from harness.seeding import CORE_NODE, SHARE_NODE, seed_nodes, unit_option


def seed(cluster: Cluster, unit: MemoryUnit) -> None:
    """The seeds' nodes at ``unit``, and the seal key as the chart's Secret, so that plain
    ``kubectl inspect cgpu`` checks seals as it does in a cluster the chart installed."""
    cluster.create_nodes(seed_nodes(unit))
    namespace, name = DEFAULT_SECRET.split("/")
    cluster.create_namespace(namespace)
    cluster.kubectl(
        "create",
        "secret",
        "generic",
        name,
        "-n",
        namespace,
        f"--from-file={SECRET_FIELD}={cluster.seal_key}",
    )


def _up(root: Path, *, real_node: bool = False, unit: MemoryUnit = MemoryUnit.GiB) -> Cluster:
    if root.exists():
        _down(root)
        shutil.rmtree(root)
    root.mkdir(parents=True)
    cluster = Cluster(root=root, binaries=build_binaries(), extender_unit=unit.value)
    cluster.start(lambda step: print(f"starting {step} ...", flush=True))
    try:
        print("creating the seed nodes ...", flush=True)
        seed(cluster, unit)
    except BaseException:
        cluster.stop()
        raise
    if real_node:
        reason = unavailable()
        if reason:
            cluster.stop()
            raise StartError(f"cannot start the real node: {reason}")
        node = RealNode(cluster=cluster, root=root / "realnode", taint=False, unit=unit.value)
        try:
            node.start(lambda step: print(f"starting {step} ...", flush=True))
        except BaseException:
            cluster.stop()
            raise
        print(
            f"real node {node.name} is Ready (containerd 2 with CDI, kubelet, gpushare device "
            f"plugin with {node.fake_gpus} fake GPUs, mode {node.mode}, device-list strategy "
            f"{node.device_list_strategy}); pods run image {node_image()} with "
            f"imagePullPolicy: Never"
        )
    example = "binpack-128mib.yaml" if unit is MemoryUnit.MiB128 else "GPUtest.yaml"
    print(f"\ncluster is up: {cluster.server} (gpuMemoryUnit {unit.value})")
    print(f"  kwok nodes: {SHARE_NODE} (share, 1 GPU), {CORE_NODE} (core_mem, 4 GPUs)")
    print("in your shell:")
    print(f"  export KUBECONFIG={cluster.kubeconfig}")
    print(f"  export PATH={cluster.binaries['kubectl'].parent}:{Path(sys.executable).parent}:$PATH")
    print(f"  kubectl inspect cgpu; kubectl apply -f {REPO / 'examples' / example}")
    print(f"gpushare extender at {cluster.extender_url}; logs in {root / 'logs'}")
    print(
        f"stop it with: make cluster-down   (or: {sys.executable} -m harness.clusterctl down "
        f"--dir {root})"
    )
    return cluster


def node_image() -> str:
    return TEST_IMAGE


def _recorded(root: Path) -> dict[int, str]:
    """What the pids files say ran: pid to component (only to report stale entries)."""
    recorded: dict[int, str] = {}
    for pids in (root / "pids", root / "realnode" / "pids"):
        with contextlib.suppress(OSError):
            for line in pids.read_text().splitlines():
                name, _, pid = line.partition(" ")
                if pid.strip().isdigit():
                    recorded[int(pid)] = name
    return recorded


def _down(root: Path) -> list[str]:
    """Stop every process of the cluster in ``root``, found by command line; say what stopped."""
    recorded = _recorded(root)
    running = find_running(root)
    lines = []
    for process in running:
        gone = stop(process)
        verb = "stopped" if gone else "could not stop"
        lines.append(f"{verb} {process.component} (pid {process.pid})")
        print(lines[-1], flush=True)
    if (root / "realnode").exists():
        clean_up_stopped(root / "realnode")
        print("cleaned up the real node (shims, mounts, bridge, device-plugin sockets)")
    stale = sorted(set(recorded) - {p.pid for p in running})
    if stale:
        names = ", ".join(f"{recorded[pid]} (pid {pid})" for pid in stale)
        print(f"left alone, recorded in the pids file but no process of this cluster now: {names}")
    if not running:
        print(f"no process of the cluster in {root} is running")
    with contextlib.suppress(FileNotFoundError):
        (root / "pids").unlink()
    return lines


def _unit_argument(text: str) -> MemoryUnit:
    try:
        return unit_option(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("--dir", default=".cluster", type=Path)
    parser.add_argument(
        "--unit",
        default=MemoryUnit.GiB,
        type=_unit_argument,
        help="gpuMemoryUnit of the extender and the seed nodes' capacity: 1GiB or 128MiB",
    )
    parser.add_argument(
        "--real-node",
        action="store_true",
        help="also start one real node (containerd, kubelet, device plugin); needs root",
    )
    args = parser.parse_args(argv)
    root = args.dir.resolve()
    try:
        if args.action == "up":
            _up(root, real_node=args.real_node, unit=args.unit)
        else:
            _down(root)
    except StartError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
