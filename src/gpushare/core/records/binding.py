"""What a bind finds when the pod is already bound: the binding is never redone.

kube-scheduler sends the same bind again when the first reply did not come in time (its
``httpTimeout``, 5 s by default), and a ``pods/binding`` call can time out after the API server
stored it. A bound pod cannot be bound again (the API server answers 409), and its annotations
are the only record of which GPU it holds: the device plugin serves it from them, and the
ledger is rebuilt from them after a restart. So a bind for a bound pod writes nothing; it only
says whether the pod already is where the scheduler wants it, with the allocation it needs.
"""

from __future__ import annotations

from gpushare.core.model.kubejson import KubeObject, key_of, node_name_of
from gpushare.core.model.status import Code, Status, refused
from gpushare.core.records.allocation import from_pod

SOURCE = "bind"
ALREADY_BOUND = Status(Code.SKIP, source=SOURCE)
"""The pod is already bound there, with what it needs: the bind has nothing to do."""


def already_bound(pod: KubeObject, *, node: str, wants_gpu: bool) -> Status:
    """Whether a bind of this bound pod to ``node`` has already succeeded (``SKIP``), or why
    it cannot (``ERROR``)."""
    key = key_of(pod)
    bound_to = node_name_of(pod)
    if bound_to != node:
        return refused(
            Code.ERROR,
            f"pod {key} is already bound to node {bound_to}, not {node}; a bound pod is never "
            f"moved, and its GPU allocation is left as it is",
            SOURCE,
        )
    if not wants_gpu:
        return ALREADY_BOUND
    allocation = from_pod(pod)
    if allocation is None or allocation.node != node:
        return refused(
            Code.ERROR,
            f"pod {key} is bound to node {node} without a gpushare allocation for that node, "
            f"so no GPU is known to be reserved for it; gpushare does not place a pod that is "
            f"already bound: delete the pod so that it is scheduled again",
            SOURCE,
        )
    return ALREADY_BOUND
