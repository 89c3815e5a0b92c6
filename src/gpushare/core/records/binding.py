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
from gpushare.core.records.allocation import from_pod


def already_bound(pod: KubeObject, *, node: str, wants_gpu: bool) -> str:
    """Why a bind of this bound pod to ``node`` cannot succeed; empty when it already has."""
    key = key_of(pod)
    bound_to = node_name_of(pod)
    if bound_to != node:
        return (
            f"pod {key} is already bound to node {bound_to}, not {node}; a bound pod is never "
            f"moved, and its GPU allocation is left as it is"
        )
    if not wants_gpu:
        return ""
    allocation = from_pod(pod)
    if allocation is None or allocation.node != node:
        return (
            f"pod {key} is bound to node {node} without a gpushare allocation for that node, "
            f"so no GPU is known to be reserved for it; gpushare does not place a pod that is "
            f"already bound: delete the pod so that it is scheduled again"
        )
    return ""
