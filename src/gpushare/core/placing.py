"""GPU choice inside a node: best fit for ``binpack``, most free for ``spread``.

Best fit leaves the smallest hole on the chosen GPU, which keeps whole GPUs free for big
requests; most free evens the load for latency-sensitive work. Ties go to the lower index so the
choice is deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpushare.core.inventory import NodeInventory, Placement
from gpushare.core.ledger import NodeUsage
from gpushare.core.requests import PodRequest


def free_after(request: PodRequest, node: NodeInventory, usage: NodeUsage, index: int) -> int:
    """Memory units left on a GPU if the pod's share went there."""
    gpu = node.gpu(index)
    total = gpu.mem_units if gpu else 0
    return total - usage.on(index).mem_units - request.mem_per_gpu


def choose_gpus(
    request: PodRequest,
    node: NodeInventory,
    usage: NodeUsage,
    fitting: Sequence[int],
) -> tuple[int, ...]:
    """Pick ``request.gpu_count`` GPUs among those that fit, by the node's placement."""

    def key(index: int) -> tuple[int, int, int]:
        left = free_after(request, node, usage, index)
        core_left = 100 - usage.on(index).core_pct - request.core_per_gpu
        if node.placement is Placement.SPREAD:
            return (-left, -core_left, index)
        return (left, core_left, index)

    ranked = sorted(fitting, key=key)
    return tuple(sorted(ranked[: request.gpu_count]))
