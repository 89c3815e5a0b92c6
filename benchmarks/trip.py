"""The trip of one GPU pod through the extender's filter, prioritize and bind, and the device
plugin's Allocate, traced.

How far one pod's decision wanders is a measure of the architecture, not of speed: a thin
adapter asks the pure core once per verb and gets back everything it needs to answer, count
and tell; a conducting adapter goes down into the core and back up many times. This drives
one pod through ``filter`` (kube-scheduler's ``nodeCacheCapable`` call, node names), then
``prioritize`` over the same nodes (as kube-scheduler calls it when more than one node passes),
``bind``, and the device plugin's ``Allocate`` for the container (the gRPC servicer's method,
called in process with kubelet's request) on the in-memory Kubernetes port, with
``sys.setprofile`` watching only the Python functions in files of the ``gpushare`` package,
and prints, per verb and for the whole trip:

- the distinct files entered, split into the pure decisions (``gpushare/core``, and the device
  plugin's ``deviceplugin/answering.py``: ``PURE``) and the adapters (every other ``gpushare``
  module: the extender, the cache, the device plugin's servicer and reads, the in-memory port);
- how many times control returns from a pure frame to an adapter frame (the route going back
  up), the caller being the nearest ``gpushare`` frame below it.

A property read on a value the core returned counts as a return too: it is a call into the core.

    PYTHONPATH=src python benchmarks/trip.py [--files]

The numbers are counts, the same on every run of the same code; the package measured is the
one ``import gpushare`` finds, so ``PYTHONPATH`` picks the tree to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

import gpushare
from gpushare.core.decision.scheduling import Scheduler, Settings
from gpushare.core.model.inventory import Mode
from gpushare.core.resourcepolicies.policybook import PolicyBook
from gpushare.deviceplugin.config import PluginConfig
from gpushare.deviceplugin.kubelet.protos.v1beta1 import api_pb2 as dp
from gpushare.deviceplugin.kubelet.servicer import DevicePluginService
from gpushare.deviceplugin.plugin import DevicePlugin
from gpushare.extender.service import Extender
from gpushare.extender.wire import ExtenderArgs, ExtenderBindingArgs
from gpushare.kube.cache import ClusterCache
from gpushare.kube.memory import MemoryKube
from gpushare.kube.objects import gpu_node, gpu_pod
from gpushare.node.gpus import FakeGpus

ROOT = str(Path(gpushare.__file__).resolve().parent) + "/"
CORE = ROOT + "core/"
PURE = (CORE, ROOT + "deviceplugin/answering.py")
"""The decisions: the core, and the device plugin's answer to Allocate, which an import contract
keeps as free of I/O as the core (``pyproject.toml``). Files of a tree without the latter count
by the core alone."""


def pure(path: str) -> bool:
    """Whether a file holds decisions (``PURE``), not an adapter."""
    return path.startswith(PURE)


NODES = ["node-a", "node-b"]
MEM = "mem"
"""The device plugin's key for the aliyun.com/gpu-mem service (``core.records.handoff.MEM``)."""


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
        if not pure(path):
            return
        caller = frame.f_back
        while caller is not None and not caller.f_code.co_filename.startswith(ROOT):
            caller = caller.f_back
        if caller is not None and not pure(caller.f_code.co_filename):
            self.returns += 1


VERBS = ("filter", "prioritize", "bind", "allocate")


async def trip(state_dir: Path) -> tuple[dict[str, Trip], bool]:
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
    traced = {verb: Trip() for verb in VERBS}
    args = ExtenderArgs(Pod=pod, NodeNames=list(NODES))
    try:
        sys.setprofile(traced["filter"].profile)
        answer = extender.filter(args)
        sys.setprofile(traced["prioritize"].profile)
        extender.prioritize(args)
        chosen = (answer.NodeNames or [""])[0]
        bind_args = ExtenderBindingArgs(
            PodName=meta["name"], PodNamespace=meta["namespace"], PodUID=meta["uid"], Node=chosen
        )
        sys.setprofile(traced["bind"].profile)
        result = await extender.bind(bind_args)
    finally:
        sys.setprofile(None)
    if not chosen or result.Error:
        return traced, False
    # kubelet admits the bound pod's container on the chosen node: Allocate for its 4 units
    plugin = DevicePlugin(
        api=kube,
        source=FakeGpus.parse("2x15GiB", node=chosen),
        config=PluginConfig(node=chosen, state_dir=state_dir),
    )
    service = DevicePluginService(plugin, MEM)
    ids = [entry.id for entry in plugin.device_list(MEM)][:4]
    request = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)])
    try:
        sys.setprofile(traced["allocate"].profile)
        response = await service.Allocate(request, None)
    finally:
        sys.setprofile(None)
    served = bool(response.container_responses[0].envs)
    return traced, served


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", action="store_true", help="list the files entered")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as state_dir:
        traced, served = asyncio.run(trip(Path(state_dir)))
    print(f"package: {ROOT}")
    print(f"pod bound and served: {served}")
    print(f"{'verb':<11} {'files':>5} {'adapter':>7} {'pure':>4} {'returns':>7}")
    every = Trip()
    for verb in VERBS:
        one = traced[verb]
        every.files |= one.files
        every.returns += one.returns
        core = sum(1 for f in one.files if pure(f))
        print(
            f"{verb:<11} {len(one.files):>5} {len(one.files) - core:>7} {core:>4} {one.returns:>7}"
        )
    core = sum(1 for f in every.files if pure(f))
    print(
        f"{'all':<11} {len(every.files):>5} {len(every.files) - core:>7} {core:>4} "
        f"{every.returns:>7}"
    )
    if args.files:
        for verb in VERBS:
            print(f"{verb}:")
            files = traced[verb].files
            for path in sorted(files, key=lambda f: (pure(f), f)):
                print("  " + path.removeprefix(ROOT))


if __name__ == "__main__":
    main()
