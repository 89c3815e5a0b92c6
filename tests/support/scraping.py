"""The extender's /metrics scraped and read, on a small cluster of GPU nodes."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from gpushare.core.model.inventory import Mode
from gpushare.kube.memory import MemoryKube
from gpushare.kube.objects import gpu_node
from tests.support.rig import Rig

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def gpu(node: str, index: int, model: str = "Tesla T4") -> tuple[tuple[str, str], ...]:
    return (("gpu", str(index)), ("model", model), ("node", node))


def cluster() -> MemoryKube:
    kube = MemoryKube()
    kube.put_node(gpu_node("node-a", gpus_units=[15, 15]))
    kube.put_node(gpu_node("node-c", gpus_units=[16], mode=Mode.CORE_MEM, model="A10"))
    kube.put_node(gpu_node("node-sick", gpus_units=[15, 15], unhealthy=[1]))
    return kube


async def scrape(rig: Rig) -> Samples:
    response = await rig.client.get("/metrics")
    assert response.status_code == 200
    return samples(response.text)
