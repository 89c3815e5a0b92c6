"""What the extender's cache holds for pods kube-scheduler has not placed yet.

A burst of pods created at once waits for kube-scheduler, and the extender keeps each one until
it is bound; at 5,000 nodes with 24,500 GPU pods created at once that burst, not the cluster's
size, set the extender's peak. This feeds N such pods to a ``ClusterCache`` as watch events,
each decoded from its own JSON as the watch does, and prints the memory the cache then holds
(``tracemalloc``: Python's own allocations, not RSS). The reference, in the same run, is the
same pods kept whole in a dict by UID, which is what the cache did before it kept only the
fields the core reads (``kube.pendingpods``).

The pod is one of the staged benchmark's GPU pods as kube-apiserver returns it before it is
bound: defaults filled in, the service-account volume (``watch_decode.api_pod``, unbound).

    python benchmarks/pending_memory.py [--pods 24500]
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from watch_decode import api_pod

from gpushare.core.decision.scheduling import Settings
from gpushare.kube.cache import ClusterCache
from gpushare.kube.lightkube_api import _slim
from gpushare.kube.memory import MemoryKube
from gpushare.kube.port import WatchEvent


def pending_pod() -> str:
    """An unbound GPU pod as the watch receives it, its name and UID to be numbered."""
    pod = api_pod()
    pod["spec"].pop("nodeName", None)
    pod["metadata"].pop("annotations", None)
    pod["metadata"]["managedFields"] = pod["metadata"]["managedFields"][:1]
    return json.dumps(pod)


def held_mib(pods: int, raw: str, take: Callable[[dict[str, Any]], None]) -> float:
    """MiB still allocated after ``take`` had each of ``pods`` numbered copies of ``raw``."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(pods):
        text = raw.replace("g00042", f"g{i:05d}").replace("6d1c7a52", f"{i:08x}")
        take(_slim(json.loads(text), "Pod"))
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return held / 2**20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=24500)
    args = parser.parse_args(argv)
    if args.pods < 1:
        parser.error(f"--pods {args.pods} is too small: give at least 1")
    raw = pending_pod()
    whole: dict[str, dict[str, Any]] = {}
    reference = held_mib(args.pods, raw, lambda pod: whole.update({pod["metadata"]["uid"]: pod}))
    whole.clear()
    cache = ClusterCache(MemoryKube(), settings=Settings())

    def watched(pod: dict[str, Any]) -> None:
        cache.apply_pod(WatchEvent(type="ADDED", object=pod))

    held = held_mib(args.pods, raw, watched)
    assert len(cache.state.pending) == args.pods
    per_pod = 2**20 / args.pods
    print(f"{args.pods} pending pods, {len(raw)} bytes of JSON each")
    print(f"kept whole (before):  {reference:.1f} MiB, {reference * per_pod:.0f} B per pod")
    print(
        f"the extender's cache: {held:.1f} MiB, {held * per_pod:.0f} B per pod "
        f"({held / reference:.2f} of whole; ledger, judgement and workload included)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
