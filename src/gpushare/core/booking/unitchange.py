"""Whether a node's GPU memory unit may change now: only while no pod holds GPU memory.

Every ``aliyun.com/gpu-mem`` count is a number of units, and pods keep their counts (and their
allocation annotations) across a restart of the device plugin. If the unit changes from 1 GiB
to 128 MiB under a pod holding ``gpu-mem: 3``, the ledger would read 3 x 128 MiB where 3 GiB is
in use, and place new pods on memory that is taken: the seed's "the scheduler ledger may become
disordered". The device plugin publishes the unit, so it checks before publishing a new one and
refuses to start instead, saying which pods hold memory and what to do.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpushare.core.booking.ledger import is_terminal
from gpushare.core.model.kubejson import (
    KubeObject,
    annotations_of,
    key_of,
    name_of,
    node_name_of,
    pod_spec_of,
)
from gpushare.core.model.names import ANN_NODE_UNIT, DEFAULT_NAMES, ResourceNames
from gpushare.core.model.units import MemoryUnit

SHOWN_PODS = 5
"""How many holders a refusal names; the count says how many more there are."""


def _holds_memory(pod: KubeObject, names: ResourceNames) -> bool:
    spec = pod_spec_of(pod)
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        if not isinstance(container, Mapping):
            continue
        resources: Any = container.get("resources") or {}
        limits: Any = resources.get("limits") if isinstance(resources, Mapping) else None
        if isinstance(limits, Mapping) and str(limits.get(names.mem, "0")).strip() not in (
            "0",
            "",
        ):
            return True
    return False


def holders(node: str, pods: Iterable[KubeObject], names: ResourceNames) -> list[str]:
    """``namespace/name`` of the live pods bound to ``node`` that hold GPU memory, sorted."""
    return sorted(
        key_of(pod)
        for pod in pods
        if node_name_of(pod) == node and not is_terminal(pod) and _holds_memory(pod, names)
    )


def refuse_unit_change(
    node: KubeObject,
    pods: Iterable[KubeObject],
    unit: MemoryUnit,
    *,
    names: ResourceNames = DEFAULT_NAMES,
) -> str | None:
    """Why ``unit`` must not replace the node's published unit now; None when it may."""
    published = str(annotations_of(node).get(ANN_NODE_UNIT) or "").strip()
    if not published:
        return None
    try:
        if MemoryUnit.parse(published) is unit:
            return None
    except ValueError:
        pass  # an unreadable unit is a different one: pods were counted in something else
    name = name_of(node)
    held = holders(name, pods, names)
    if not held:
        return None
    shown = ", ".join(held[:SHOWN_PODS])
    more = f" and {len(held) - SHOWN_PODS} more" if len(held) > SHOWN_PODS else ""
    return (
        f"node {name} publishes {ANN_NODE_UNIT}={published} but this device plugin is "
        f"configured with gpuMemoryUnit {unit.value}, and {len(held)} pod(s) still hold "
        f"{names.mem} counted in {published}: {shown}{more}. Changing the unit now would "
        f"disorder the scheduler's ledger; drain the GPU pods from this node first (kubectl "
        f"drain, or delete them) and restart the plugin, or keep gpuMemoryUnit {published}"
    )
