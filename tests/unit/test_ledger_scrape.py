"""A scrape of the extender's per-GPU gauges builds one family at a time.

At 5,000 nodes of 8 GPUs each, each per-GPU family is 40,000 samples, a labels dict each; the
six built at once came to about 100 MiB for the length of every scrape. Prometheus's formatter
takes a family and writes it out before it asks for the next, so a family let go when the next
is built never coexists with the others.
"""

from __future__ import annotations

import gc
import weakref

from prometheus_client import generate_latest

from gpushare.core.booking.changes import NodeTable
from gpushare.core.decision.scheduling import Settings
from gpushare.core.model.inventory import read_node
from gpushare.extender.metrics import ExtenderMetrics, _LedgerCollector
from gpushare.kube.cache import ClusterCache
from gpushare.kube.memory import MemoryKube
from gpushare.kube.objects import gpu_node


def _cache() -> ClusterCache:
    cache = ClusterCache(MemoryKube(), settings=Settings())
    names = ("n0", "n1")
    cache.nodes = NodeTable((n, read_node(gpu_node(n, gpus_units=[15, 15]))) for n in names)
    cache.synced = True
    return cache


def test_a_per_gpu_family_is_let_go_before_the_next_is_built() -> None:
    cache = _cache()
    families = _LedgerCollector(lambda: cache).collect()
    first = next(families)
    assert first.name == "gpushare_gpu_memory_bytes" and len(first.samples) == 4
    gone = weakref.ref(first)
    del first
    second = next(families)
    gc.collect()
    assert gone() is None
    assert second.name == "gpushare_gpu_memory_allocated_bytes" and len(second.samples) == 4


def test_the_scrape_exports_every_gpu_of_every_family() -> None:
    cache = _cache()
    page = generate_latest(ExtenderMetrics(lambda: cache).registry).decode()
    for name in ("memory_bytes", "memory_allocated_bytes", "pods", "unhealthy"):
        lines = [line for line in page.splitlines() if line.startswith(f"gpushare_gpu_{name}{{")]
        assert len(lines) == 4, name
    assert 'gpushare_gpu_memory_bytes{gpu="1",model="Tesla T4",node="n1"} 1.610612736e+10' in page
    assert "gpushare_cache_synced 1.0" in page
