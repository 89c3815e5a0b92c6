"""GPUs an operator takes out of service on a node, without draining the node.

A GPU that misbehaves short of an XID error (slow, throttling, awaiting a reseat) should stop
receiving pods while its neighbours keep working. Cordoning or draining the node would stop all
of them, so the operator names the GPU on the node instead::

    kubectl annotate node n1 gpushare.io/gpus-disabled=1,3

It is an annotation and not a label because the value is a list (label values cannot hold a
comma) and nothing needs to select nodes by it; removing it puts the GPUs back in service.

Pods already on such a GPU keep running and keep their share: the ledger still counts them, only
the filter stops choosing the GPU. A value that cannot be read does not name which GPU to
protect, so the whole node takes no new pod until it is fixed, and the filter says why; guessing
would risk placing on the very GPU the operator meant to stop.
"""

from __future__ import annotations

from collections.abc import Collection

from gpushare.core.model.kubejson import whole_number
from gpushare.core.model.names import ANN_NODE_GPUS_DISABLED

RULE = (
    "must be GPU indexes of this node, comma-separated (for example 1,3); an empty value "
    "disables none"
)


def parse_disabled(text: str, *, node: str, indexes: Collection[int]) -> tuple[frozenset[int], str]:
    """The indexes the annotation takes out of service, or a problem naming value and rule."""
    hint = f"node {node}: annotation {ANN_NODE_GPUS_DISABLED}={text!r}"
    fix = f"fix it with kubectl annotate --overwrite node {node} {ANN_NODE_GPUS_DISABLED}=..."
    chosen: set[int] = set()
    for part in text.split(","):
        token = part.strip()
        if not token:
            continue
        index = whole_number(token)
        if index is None:
            return frozenset(), f"{hint}: {token!r} is not an integer; the value {RULE}; {fix}"
        if index not in indexes:
            known = ", ".join(str(i) for i in sorted(indexes)) or "none"
            return frozenset(), (
                f"{hint}: GPU {index} is not on this node (it has GPU {known}); the value "
                f"{RULE}; {fix}"
            )
        chosen.add(index)
    return frozenset(chosen), ""
