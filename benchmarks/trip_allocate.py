"""The trip of one container's ``Allocate`` through the device plugin, traced.

The node side of ``trip.py``: one pod placed and bound by the extender on the in-memory
Kubernetes port, then kubelet's ``Allocate`` for its container as the device plugin's gRPC
service passes it on (``DevicePlugin.allocate``: read the node's pods, answer, hand over), with
``sys.setprofile`` watching only the Python functions in files of the ``gpushare`` package. It
prints, as ``trip.py`` does, the distinct files entered, split into the core
(``gpushare/core``) and the rest, and how many times control returns from a core frame to a
frame outside it.

    PYTHONPATH=src python benchmarks/trip_allocate.py [--files]

The numbers are counts, the same on every run of the same code; ``PYTHONPATH`` picks the tree.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # trip.py, beside this file

from trip import CORE, ROOT, Trip

from gpushare.core.decision.scheduling import Scheduler, Settings
from gpushare.core.model.inventory import Mode
from gpushare.core.records.handoff import MEM
from gpushare.core.resourcepolicies.policybook import PolicyBook
from gpushare.deviceplugin.config import PluginConfig
from gpushare.deviceplugin.plugin import DevicePlugin
from gpushare.extender.service import Extender
from gpushare.extender.wire import ExtenderArgs, ExtenderBindingArgs
from gpushare.kube.cache import ClusterCache
from gpushare.kube.memory import MemoryKube
from gpushare.kube.objects import gpu_node, gpu_pod
from gpushare.node.gpus import FakeGpus

NODE = "node-a"
MEM_UNITS = 4


async def trip(state_dir: Path) -> tuple[Trip, bool]:
    kube = MemoryKube()
    kube.put_node(gpu_node(NODE, gpus_units=[15] * 2, mode=Mode.SHARE))
    pod = kube.create_pod(gpu_pod("trip", mem=MEM_UNITS))
    settings = Settings()
    scheduler = Scheduler(settings)
    cache = ClusterCache(kube, settings=settings, workload=scheduler.workload, book=PolicyBook())
    await cache.sync()
    extender = Extender(
        api=kube, cache=cache, scheduler=scheduler, clock_ns=lambda: 1_700_000_000_000_000_000
    )
    meta = pod["metadata"]
    extender.filter(ExtenderArgs(Pod=pod, NodeNames=[NODE]))
    bound = await extender.bind(
        ExtenderBindingArgs(
            PodName=meta["name"], PodNamespace=meta["namespace"], PodUID=meta["uid"], Node=NODE
        )
    )
    if bound.Error:
        raise SystemExit(f"the pod was not bound: {bound.Error}")
    plugin = DevicePlugin(
        api=kube,
        source=FakeGpus.parse("2x15GiB", node=NODE),
        config=PluginConfig(node=NODE, state_dir=state_dir),
    )
    device_ids = [f"GPU-fake-mem-{k}" for k in range(MEM_UNITS)]
    traced = Trip()
    sys.setprofile(traced.profile)
    try:
        answer = await plugin.allocate(MEM, device_ids)
    finally:
        sys.setprofile(None)
    return traced, hasattr(answer, "envs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", action="store_true", help="list the files entered")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as state:
        traced, served = asyncio.run(trip(Path(state)))
    core = sorted(f for f in traced.files if f.startswith(CORE))
    adapter = sorted(f for f in traced.files if not f.startswith(CORE))
    print(f"package: {ROOT}")
    print(f"container served: {served}")
    print(f"files entered: {len(traced.files)} ({len(adapter)} adapter, {len(core)} core)")
    print(f"returns from the core to an adapter: {traced.returns}")
    if args.files:
        for path in adapter + core:
            print("  " + path.removeprefix(ROOT))


if __name__ == "__main__":
    main()
