"""How a multi-GPU pod's containers are spread over its GPUs (pure arithmetic, no I/O).

A pod labelled ``aliyun.com/gpu-count: N`` gets N GPUs, and each of its containers a share on
each of them. The device plugin answers kubelet's ``Allocate`` from the device count alone
(core.records.handoff), so two containers of one pod that ask for the same amount must get the same
share on every GPU, or the plugin cannot tell which of the two layouts to serve. So the layout
is chosen per distinct amount, never per container: every container asking for ``a`` gets
``a // N`` on each GPU, and the ``a % N`` units left over go one each to as many GPUs.

Which GPUs take the units left over decides how even the pod's holding is. Amounts that
running containers (regular and sidecars) ask for go first, those asked for by the most
containers first, each onto the GPUs with the fewest left-over units so far; with one container
per amount that keeps every GPU within one unit of the others, and even when the total divides
by N. Equal containers whose amount does not divide by N cannot be even (two containers of 3
over 2 GPUs hold 4 and 2): the pod then holds more on some GPUs, and the scheduler fits it by its
largest share. Amounts only ordinary init containers ask for run before the others and alone,
so their left-over units go where the running containers already hold most, where they add
least to the pod's peak.
"""

from __future__ import annotations

from collections.abc import Sequence


def spread(amounts: Sequence[int], running: Sequence[bool], count: int) -> list[tuple[int, ...]]:
    """Each container's share on each of ``count`` GPU positions; equal amounts, equal shares.

    ``running[i]`` says whether container ``i`` runs alongside the others (a regular container
    or a sidecar) rather than alone before them (an ordinary init container).
    """
    if count <= 1:
        return [(amount,) for amount in amounts]
    weight: dict[int, int] = {}
    for amount, runs in zip(amounts, running, strict=True):
        weight[amount] = weight.get(amount, 0) + int(runs)
    left_over = [0] * count
    extra: dict[int, frozenset[int]] = {}
    for amount in sorted((a for a in weight if weight[a]), key=lambda a: -weight[a]):
        chosen = sorted(range(count), key=lambda p: (left_over[p], p))[: amount % count]
        for position in chosen:
            left_over[position] += weight[amount]
        extra[amount] = frozenset(chosen)
    for amount in (a for a in weight if not weight[a]):
        chosen = sorted(range(count), key=lambda p: (-left_over[p], p))[: amount % count]
        extra[amount] = frozenset(chosen)
    return [
        tuple(amount // count + (position in extra[amount]) for position in range(count))
        for amount in amounts
    ]
