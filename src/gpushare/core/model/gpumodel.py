"""GPU models: which one a node has and which ones a pod accepts.

A pod restricts models the way Kubernetes lets it, through the node's model label
``aliyun.accelerator/nvidia_name`` (ACK's GPU node label; NVIDIA's GPU feature discovery writes
``nvidia.com/gpu.product``, which is read when ACK's is absent): ``spec.nodeSelector`` or a
required node affinity ``In`` on that key. kube-scheduler enforces it (NodeAffinity); the
fragmentation-aware policy only needs to know it, because a shape restricted to other models
cannot use any GPU on the node, so the node's idle share is a fragment for it.

Several required terms are alternatives (ORed), so the pod accepts the union of their values,
and only when every term names the key; a term without it accepts any model. ``NotIn`` and
other operators are not read: the pod then counts as accepting any model, which can only make
the policy see less fragmentation than there is, never block a placement.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from gpushare.core.model.kubejson import KubeObject, labels_of, pod_spec_of

LABEL_MODEL = "aliyun.accelerator/nvidia_name"
"""The node label ACK puts on GPU nodes, naming the card (for example ``Tesla-T4``)."""
LABEL_MODEL_NFD = "nvidia.com/gpu.product"
"""The same from NVIDIA's GPU feature discovery."""
LABEL_COUNT = "aliyun.accelerator/nvidia_count"
"""The node label ACK puts on GPU nodes, counting the cards (for example ``4``)."""
LABEL_MEM = "aliyun.accelerator/nvidia_mem"
"""The node label ACK puts on GPU nodes, giving one card's memory (for example ``15360MiB``)."""

_LABEL_VALUE_MAX = 63
_NOT_IN_LABEL = re.compile(r"[^A-Za-z0-9._-]")
_EDGES = "._-"


def model_label_value(name: str) -> str:
    """NVML's model name as a label value: ``Tesla T4`` -> ``Tesla-T4``; empty if nothing is left.

    A label value is at most 63 characters of letters, digits, ``-``, ``_`` and ``.``, starting
    and ending with a letter or digit, so every other character (NVML names have spaces)
    becomes ``-`` and the edges are trimmed; ACK's labels read the same way.
    """
    value = _NOT_IN_LABEL.sub("-", name.strip())[:_LABEL_VALUE_MAX]
    return value.strip(_EDGES)


def gpu_node_labels(models: Sequence[str], memory_mib: Sequence[int]) -> dict[str, str | None]:
    """The model, count and memory labels for a node with these GPUs (None removes one).

    A label says one thing about every card, so the model (and the memory) is written only
    when all GPUs agree, and removed otherwise: a nodeSelector on one model must not land on a
    node where it would get another.
    """
    names = {model_label_value(m) for m in models}
    sizes = set(memory_mib)
    model = names.pop() if len(names) == 1 else ""
    return {
        LABEL_MODEL: model or None,
        LABEL_COUNT: str(len(models)),
        LABEL_MEM: f"{sizes.pop()}MiB" if len(sizes) == 1 else None,
    }


def node_model(node: KubeObject) -> str:
    """The node's GPU model label (ACK's first); empty when it has none."""
    labels = labels_of(node)
    return str(labels.get(LABEL_MODEL) or labels.get(LABEL_MODEL_NFD) or "")


def _term_models(term: Any) -> set[str] | None:
    """Models one required node-selector term allows; None when it does not restrict them."""
    if not isinstance(term, Mapping):
        return None
    allowed: set[str] | None = None
    for expression in term.get("matchExpressions") or []:
        if not isinstance(expression, Mapping):
            continue
        if expression.get("key") not in (LABEL_MODEL, LABEL_MODEL_NFD):
            continue
        if expression.get("operator") != "In":
            continue
        values = {str(v) for v in expression.get("values") or []}
        allowed = values if allowed is None else allowed & values
    return allowed


def pod_models(pod: KubeObject) -> tuple[str, ...]:
    """The GPU models the pod accepts, sorted; empty means any."""
    spec = pod_spec_of(pod)
    selector = spec.get("nodeSelector") or {}
    chosen: set[str] | None = None
    if isinstance(selector, Mapping):
        for key in (LABEL_MODEL, LABEL_MODEL_NFD):
            if key in selector:
                chosen = {str(selector[key])}
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = affinity.get("nodeSelectorTerms") if isinstance(affinity, Mapping) else None
    if isinstance(terms, list) and terms:
        union: set[str] = set()
        for term in terms:
            allowed = _term_models(term)
            if allowed is None:
                union = set()
                break
            union |= allowed
        else:
            chosen = union if chosen is None else chosen & union
    return tuple(sorted(chosen)) if chosen is not None else ()
