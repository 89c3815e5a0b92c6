"""Random clusters and request streams (hypothesis strategies) and the invariant they keep."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from gpushare.core.booking.ledger import Ledger
from gpushare.core.model.inventory import SHARED_MODES, NodeInventory, read_node
from gpushare.kube.objects import gpu_node, gpu_pod


@st.composite
def clusters(draw: st.DrawFn) -> list[NodeInventory]:
    count = draw(st.integers(1, 4))
    nodes = []
    for i in range(count):
        gpus = draw(st.lists(st.integers(1, 40), min_size=1, max_size=4))
        unhealthy = draw(st.lists(st.integers(0, len(gpus) - 1), max_size=1))
        node = gpu_node(
            f"n{i}",
            gpus_units=gpus,
            mode=draw(st.sampled_from(SHARED_MODES)),
            placement=draw(st.sampled_from(["binpack", "spread"])),
            unhealthy=unhealthy,
        )
        nodes.append(read_node(node))
    return nodes


@st.composite
def pods(draw: st.DrawFn, index: int) -> dict[str, Any]:
    count = draw(st.integers(1, 3))
    mem = draw(st.integers(1, 12)) * count
    core = draw(st.sampled_from([None, 5, 10, 30, 50, 100]))
    pod = gpu_pod(
        f"p{index}",
        mem=mem,
        core=None if core is None else core * count,
        gpu_count=str(count) if count > 1 else None,
    )
    pod["metadata"]["uid"] = f"uid-{index}"
    return pod


def assert_never_overcommitted(nodes: list[NodeInventory], ledger: Ledger) -> None:
    for node in nodes:
        usage = ledger.usage(node.name)
        for gpu in node.gpus:
            held = usage.on(gpu.index)
            assert held.mem_units <= gpu.mem_units, (node.name, gpu.index, held)
            assert held.core_pct <= 100, (node.name, gpu.index, held)
            if node.mode.isolated:
                assert held.pods <= node.unit.default_max_pods_per_gpu
        for index in usage.gpus:
            assert node.gpu(index) is not None
