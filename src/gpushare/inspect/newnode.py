"""Whether the explained pod waits for a new node, in ``--explain``'s words (pure).

A pod that no existing GPU holds gets a node from an autoscaler only through gpushare's
placeholder pods (``core.autoscaling.placeholders``, docs/autoscaling.md): cluster-autoscaler
and Karpenter judge ``aliyun.com/gpu-mem`` by node totals and never ask the extender. So when
no node fits, the question a user has next is "is a node coming?", and the answer is in the
placeholders of the installed extender's namespace: one whose ``gpushare.io/placeholder-for``
names the pod's UID asks the autoscaler for a new node's GPUs on its behalf.

What is said stays within the pod: the placeholder's name and the GPUs it asks for, never the
other pods it stands for (its ``gpushare.io/placeholder-pods`` names them, and they may be
another tenant's). When no placeholder stands for the pod, the line says whether the
installed extender keeps placeholders at all (its ``--placeholder-namespace`` flag, read by
``inspect.installed``), or that this could not be read.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from gpushare.core.autoscaling.placeholders import (
    ANN_GPU_MIB,
    is_placeholder,
    read_placeholder,
)
from gpushare.core.model.kubejson import (
    KubeObject,
    annotations_of,
    name_of,
    node_name_of,
    pod_spec_of,
    uid_of,
)
from gpushare.core.model.names import DEFAULT_NAMES, ResourceNames


@dataclass(frozen=True)
class PlaceholderSight:
    """What ``--explain`` knows of the installed extender's placeholders."""

    namespace: str
    """Where to look for them: the extender's ``--placeholder-namespace`` (empty: it keeps
    none), or, when its flags were not read, the namespace gpushare is installed in."""
    known: bool = True
    """Whether the extender's flags were read (False: ``namespace`` is a guess)."""
    pods: tuple[KubeObject, ...] = ()
    """The pods listed, among which its placeholders are (``seeing`` keeps only those)."""

    def seeing(self, pods: Iterable[KubeObject]) -> PlaceholderSight:
        """The same, with the placeholders among ``pods``."""
        found = tuple(p for p in pods if self.namespace and is_placeholder(p, self.namespace))
        return replace(self, pods=found)


def _gpus(pod: KubeObject, names: ResourceNames) -> int:
    """The GPUs a placeholder asks for (its one container's ``gpu-count`` request)."""
    total = 0
    for container in pod_spec_of(pod).get("containers") or []:
        requests = (container.get("resources") or {}).get("requests") or {}
        try:
            total += int(str(requests.get(names.count, 0)))
        except ValueError:
            continue
    return total


def _size(pod: KubeObject) -> str:
    text = annotations_of(pod).get(ANN_GPU_MIB, "")
    if not text.isdigit() or not int(text):
        return ""
    mib = int(text)
    return f" of {mib // 1024} GiB" if mib % 1024 == 0 else f" of {mib} MiB"


def new_node_line(
    pod: KubeObject,
    *,
    fits_somewhere: bool,
    wants_gpu: bool,
    sight: PlaceholderSight | None,
    names: ResourceNames = DEFAULT_NAMES,
) -> str:
    """One line on whether the pod waits for a new node; empty when there is nothing to say
    (it fits a node, is bound, asks no GPU memory, or nothing is known of placeholders)."""
    if sight is None:
        return ""
    if is_placeholder(pod, sight.namespace or "\0"):
        held = read_placeholder(pod)
        gpus = _gpus(pod, names)
        return (
            f"this is a gpushare placeholder: it stands for {len(held.covers)} pod(s) no existing "
            f"GPU holds and asks the autoscaler for a new node's GPUs ({gpus} GPU(s)"
            f"{_size(pod)}); nobody binds it, and gpushare deletes it once they bind or go"
        )
    if fits_somewhere or not wants_gpu or node_name_of(pod):
        return ""
    uid = uid_of(pod)
    if sight.namespace and uid:
        for other in sight.pods:
            if not is_placeholder(other, sight.namespace):
                continue
            if uid in read_placeholder(other).covers:
                gpus = _gpus(other, names)
                return (
                    f"waits for a new node: placeholder {name_of(other)} asks the autoscaler "
                    f"for one ({gpus} GPU(s){_size(other)})"
                )
    if not sight.known:
        return (
            f"no placeholder in namespace {sight.namespace or '-'} stands for it, and whether the "
            f"installed extender keeps placeholders is unknown (its Deployment's flags could "
            f"not be read); without one an autoscaler may add no node (docs/autoscaling.md)"
        )
    if not sight.namespace:
        return (
            "no new node is asked for: the installed extender keeps no placeholders (no "
            "--placeholder-namespace; chart value autoscaling.placeholders), and an autoscaler "
            "judges GPU memory by node totals, so it may add no node (docs/autoscaling.md)"
        )
    return (
        f"no placeholder stands for it yet: the installed extender keeps them in namespace "
        f"{sight.namespace} and makes one a few seconds after its filter first refuses the pod "
        f"on every node, "
        f"unless autoscaling.maxPlaceholders or autoscaling.perNamespace holds it back or no "
        f"node of its pool was seen and autoscaling.newNodeGpuMemoryMiB is 0 (the extender's "
        f"log says which)"
    )
