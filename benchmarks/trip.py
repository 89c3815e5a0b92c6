"""The trip of one GPU pod through the extender's filter and bind, traced.

How far one pod's decision wanders is a measure of the architecture, not of speed: a thin
adapter asks the pure core once per verb and gets back everything it needs to answer, count
and tell; a conducting adapter goes down into the core and back up many times. This drives
one pod through ``filter`` (kube-scheduler's ``nodeCacheCapable`` call, node names) then
``bind`` on the in-memory Kubernetes port, with ``sys.setprofile`` watching only the Python
functions in files of the ``gpushare`` package, and prints:

- the distinct files entered, split into the core (``gpushare/core``) and the adapters (every
  other ``gpushare`` module: the extender, the cache, the in-memory port);
- how many times control returns from a core frame to an adapter frame (the route going back
  up), the caller being the nearest ``gpushare`` frame below it.

    PYTHONPATH=src python benchmarks/trip.py [--files]

The numbers are counts, the same on every run of the same code; the package measured is the
one ``import gpushare`` finds, so ``PYTHONPATH`` picks the tree to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import gpushare
from gpushare.core.decision.scheduling import Scheduler, Settings
from gpushare.core.model.inventory import Mode
from gpushare.core.resourcepolicies.policybook import PolicyBook
from gpushare.extender.service import Extender
from gpushare.extender.wire import ExtenderArgs, ExtenderBindingArgs
from gpushare.kube.cache import ClusterCache
from gpushare.kube.memory import MemoryKube
from gpushare.kube.objects import gpu_node, gpu_pod

ROOT = str(Path(gpushare.__file__).resolve().parent) + "/"
CORE = ROOT + "core/"
NODES = ["node-a", "node-b"]


class Trip:
    """Files entered and core-to-adapter returns, from ``sys.setprofile`` events."""

    def __init__(self) -> None:
        self.files: set[str] = set()
        self.returns = 0

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event not in ("call", "return"):
            return
        path = frame.f_code.co_filename
        if not path.startswith(ROOT):
            return
        if event == "call":
            self.files.add(path)
            return
        if not path.startswith(CORE):
            return
        caller = frame.f_back
        while caller is not None and not caller.f_code.co_filename.startswith(ROOT):
            caller = caller.f_back
        if caller is not None and not caller.f_code.co_filename.startswith(CORE):
            self.returns += 1


async def trip() -> tuple[Trip, bool]:
    kube = MemoryKube()
    for name in NODES:
        kube.put_node(gpu_node(name, gpus_units=[15] * 2, mode=Mode.CGPU))
    pod = kube.create_pod(gpu_pod("trip", mem=4))
    settings = Settings()
    scheduler = Scheduler(settings)
    cache = ClusterCache(kube, settings=settings, workload=scheduler.workload, book=PolicyBook())
    await cache.sync()
    extender = Extender(
        api=kube, cache=cache, scheduler=scheduler, clock_ns=lambda: 1_700_000_000_000_000_000
    )
    meta = pod["metadata"]
    filter_args = ExtenderArgs(Pod=pod, NodeNames=list(NODES))
    traced = Trip()
    sys.setprofile(traced.profile)
    try:
        answer = extender.filter(filter_args)
        chosen = (answer.NodeNames or [""])[0]
        bind_args = ExtenderBindingArgs(
            PodName=meta["name"], PodNamespace=meta["namespace"], PodUID=meta["uid"], Node=chosen
        )
        result = await extender.bind(bind_args)
    finally:
        sys.setprofile(None)
    return traced, bool(chosen) and not result.Error


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", action="store_true", help="list the files entered")
    args = parser.parse_args()
    traced, bound = asyncio.run(trip())
    core = sorted(f for f in traced.files if f.startswith(CORE))
    adapter = sorted(f for f in traced.files if not f.startswith(CORE))
    print(f"package: {ROOT}")
    print(f"pod bound: {bound}")
    print(f"files entered: {len(traced.files)} ({len(adapter)} adapter, {len(core)} core)")
    print(f"returns from the core to an adapter: {traced.returns}")
    if args.files:
        for path in adapter + core:
            print("  " + path.removeprefix(ROOT))


if __name__ == "__main__":
    main()
