"""Sentences that explain a placement or a refusal to a person (pure).

The extender puts them into pod Events and ``kubectl inspect cgpu --explain`` prints them, so
``kubectl describe pod`` and the what-if view say the same thing: where a pod went with how full
its GPUs are now, or, when no node fits, how many nodes refused it for each reason.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from gpushare.core.booking.ledger import NodeUsage
from gpushare.core.model.inventory import CORE_PER_GPU, NodeInventory
from gpushare.core.records.allocation import Allocation

MAX_MESSAGE = 1000
"""Longest message written (events.k8s.io caps ``note`` at 1 kB; kubectl wraps longer)."""

SHOWN_REASONS = 5
"""Distinct refusal reasons spelled out; the rest are counted."""


def clip(text: str, limit: int = MAX_MESSAGE) -> str:
    """``text`` cut to ``limit`` characters, ending in an ellipsis where it was cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def placement_message(allocation: Allocation, node: NodeInventory, usage: NodeUsage) -> str:
    """Where a pod was placed and how full its GPUs are with it: ``GPU1 on node-a, 3/15 GiB``.

    ``usage`` is the node's holding after the booking, so the numbers are the ones
    ``kubectl inspect cgpu`` shows next. Computing power is added where the pod holds some.
    """
    parts = []
    for share in allocation.gpus:
        gpu = node.gpu(share.index)
        held = usage.on(share.index)
        text = node.unit.describe_ratio(held.mem_units, gpu.mem_units if gpu else 0)
        if share.core_pct:
            text += f", {held.core_pct}/{CORE_PER_GPU}% computing power"
        parts.append((share.index, text))
    if len(parts) == 1:
        index, text = parts[0]
        return clip(f"GPU{index} on {allocation.node}, {text}")
    where = "+".join(f"GPU{i}" for i, _ in parts)
    detail = "; ".join(f"GPU{i} {text}" for i, text in parts)
    return clip(f"{where} on {allocation.node}: {detail}")


ASKED = "nodes kube-scheduler asked gpushare about fit"
SCHEDULER_MESSAGE_MAX = 1024
"""kube-scheduler cuts its FailedScheduling message to this many bytes (``truncateMessage`` in
``pkg/scheduler/schedule_one.go``), ending it with `` ...``."""
OTHER_REASONS_ROOM = 256
"""Bytes left in that message for kube-scheduler's own plugins' reasons and its preemption
sentence, which it sorts among and after the extender's."""


def scheduler_says_it(reasons: Iterable[str], asked: int) -> bool:
    """Whether kube-scheduler's FailedScheduling event carries every one of these reasons whole.

    kube-scheduler writes each node the extender's filter refused into its FitError with the
    extender's reason, counted per distinct reason (``0/3 nodes are available: 2 <reason>, 1
    <reason>.``), so ``kubectl describe pod`` shows gpushare's reasons there. A second Warning
    from gpushare saying the same is noise; it is still written when the reasons would not fit
    in kube-scheduler's message whole (many distinct reasons), where gpushare's counted summary
    is the one that says them all.
    """
    counts = Counter(reasons)
    listed = ", ".join(f"{n} {reason}" for reason, n in sorted(counts.items()))
    text = f"0/{asked} nodes are available: {listed}."
    return len(text.encode()) + OTHER_REASONS_ROOM <= SCHEDULER_MESSAGE_MAX


"""What the extender's count counts: kube-scheduler calls it only with the nodes its own filters
(taints, node selectors, CPU) kept, so its ``0/1`` stands beside kube-scheduler's ``0/2 nodes
are available`` and must say it is the smaller set."""

IN_CLUSTER = "nodes in the cluster pass gpushare's checks"
"""What ``kubectl inspect cgpu --explain`` counts: every node, by gpushare's checks alone."""


def refusal_summary(reasons: Iterable[str], total_nodes: int, counted: str = ASKED) -> str:
    """Why no node fits, counted per reason: ``0/12 <counted>: 8 × ...; 4 × ...``.

    ``counted`` is ``ASKED`` (the extender's event) or ``IN_CLUSTER`` (``--explain``).

    ``reasons`` has one message per refusing node; ``counted`` says which nodes the total
    counts, so the number never reads as a contradiction of kube-scheduler's own count. The
    most frequent reasons come first; past ``SHOWN_REASONS`` distinct ones the rest are counted,
    and the text is clipped to ``MAX_MESSAGE``, so a scheduler retrying a pod never writes an
    unbounded event.
    """
    counts = Counter(reasons)
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    shown = [f"{n} × {reason}" for reason, n in ranked[:SHOWN_REASONS]]
    rest = ranked[SHOWN_REASONS:]
    if rest:
        nodes = sum(n for _, n in rest)
        shown.append(f"{nodes} node(s) for {len(rest)} other reason(s)")
    head = f"0/{total_nodes} {counted}"
    return clip(f"{head}: {'; '.join(shown)}" if shown else head)
