"""Placeholder pods: the GPU demand gpushare refused, in a shape stock autoscalers understand.

The trap (../shared/docs/AUTOSCALERS.md 1d): cluster-autoscaler drops every pending pod its
in-tree framework can place on an existing node by node-level totals
(``core/podlistprocessor/filter_out_schedulable.go``), so a pod that no single GPU holds but
whose node's GPUs add up to enough never gets a node; and its estimator packs new nodes by
totals too, so 5 pods of 10 GiB on template nodes of 4 x 16 GiB get one node, where GPU by GPU
they need two. Karpenter packs the same way. Neither asks an extender.

gpushare answers with pods they do understand. Each *virtual GPU* that the refused pods
(``core.autoscaling.shortfall``) need, packed GPU by GPU with the memory of the GPUs of their
pool, becomes one placeholder pod in the release namespace that:

- asks ``aliyun.com/gpu-count: 1`` and nothing else: a node offers as many as it has GPUs
  (the device plugin publishes it; a template declares it), so the autoscaler packs at most
  that many placeholders per new node, which is GPU by GPU; and the real pods' gpu-mem is not
  counted twice (the autoscaler still sees the real pods, which no longer decide the count);
- carries the real pods' node selector, required node affinity and tolerations, plus a
  requirement only a new node satisfies. For cluster-autoscaler (``exclusion="hostname"``): a
  required ``matchFields`` ``metadata.name NotIn`` every GPU node that existed when it was made
  (a template node, warm or cold, gets a fresh name and hostname,
  ``template-node-for-<group>-<n>``: ``simulator/node_info_utils.go``; a warm template copies
  every other label of a real node, so no label would do; the node's name, not its hostname
  label, which a platform may set otherwise). Karpenter refuses any pod
  whose affinity names ``kubernetes.io/hostname`` (``IsRestrictedLabel``,
  ``pkg/apis/v1/labels.go``: "ignoring pod"), so for it (``exclusion="label"``):
  ``gpushare.io/gpus-published DoesNotExist``, the label gpushare's device plugin writes on
  its node with the GPU inventory; a NodeClaim Karpenter plans has no such label (a
  requirement on a label its NodePool does not define is met by ``DoesNotExist``);
- names a scheduler nobody runs (``gpushare-placeholder``), so it is never bound, and is
  marked ``PodScheduled=False/Unschedulable`` by gpushare, which is what both autoscalers
  read as "needs room" (CA's ``utils/kubernetes/listers.go``; Karpenter's provisionable pods).

A placeholder lasts while a pod it stands for is still refused everywhere. It goes when they
are bound or gone, and is made again (the pods packed anew) when one of them was refused by a
node newer than the placeholder: that node came and did not help. While a new node is on its
way the placeholder fits it in the autoscaler's view, so nothing is added twice, and the node
count settles once the pods bind (CA's ``filter_out_schedulable`` keeps the placeholder from a
second scale-up).

Cost at 1,000 nodes: one placeholder per virtual GPU, at most ``limit`` in all and ``per_namespace``
pods of one namespace per round (so one tenant's flood cannot take every placeholder); each
holds the names of the GPU nodes in its affinity, about 30 bytes a node, 30 KB at 1,000 nodes,
written once (a pod's affinity is immutable) and read by the autoscaler's simulation as one
set lookup per node. The API sees a create, a status patch and a delete per virtual GPU.

Pure: the state's values in, the plan (what to create, mark and delete) out.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpushare.core.autoscaling.shortfall import Shortfall
from gpushare.core.model.kubejson import (
    KubeObject,
    annotations_of,
    labels_of,
    meta,
    name_of,
    namespace_of,
    pod_spec_of,
    uid_of,
)
from gpushare.core.model.names import DEFAULT_NAMES, LABEL_NODE_GPUS_PUBLISHED, ResourceNames
from gpushare.core.model.requests import PodRequest, read_pod
from gpushare.core.model.units import MemoryUnit

PLACEHOLDER_LABEL = "gpushare.io/placeholder"
"""Every placeholder carries it (value ``"true"``): how gpushare finds its own."""
ANN_FOR = "gpushare.io/placeholder-for"
"""The UIDs of the pods a placeholder stands for, comma separated."""
ANN_PODS = "gpushare.io/placeholder-pods"
"""Their ``namespace/name``, for people (``kubectl get pod -o yaml``)."""
ANN_GPU_MIB = "gpushare.io/placeholder-gpu-mib"
"""The memory of the GPU the pods were packed into, MiB."""
PLACEHOLDER_SCHEDULER = "gpushare-placeholder"
"""A scheduler name nobody serves: placeholders are never bound."""
HOSTNAME = "kubernetes.io/hostname"
NAME_FIELD = "metadata.name"
EXCLUSIONS = ("hostname", "label")
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
PREFIX = "gpushare-placeholder-"
CORE_PER_GPU = 100
UNSCHEDULABLE = "Unschedulable"
MARK_MESSAGE = (
    "gpushare placeholder: {pods} fit no existing GPU; it asks the autoscaler for a new "
    "node's GPU and is never bound"
)


@dataclass(frozen=True, kw_only=True)
class PlaceholderSettings:
    """How placeholders are made (the chart's ``autoscaling`` values)."""

    namespace: str
    """The release namespace: placeholders live there, beside gpushare."""
    limit: int = 64
    """At most this many placeholders at once."""
    per_namespace: int = 16
    """At most this many refused pods of one namespace are planned per round."""
    settle_s: float = 3.0
    """A pod is planned once it was first refused this long ago, so a burst is packed whole."""
    grace_s: float = 120.0
    """A placeholder stays this long for a pod still pending but not refused since (the
    extender restarted and kube-scheduler has not tried it again, or it is on its way to bind),
    so a restart never deletes and re-creates placeholders while their nodes are coming."""
    new_node_gpu_mib: int = 0
    """The GPU memory (MiB) assumed for a pod none of whose refusing nodes had room to speak
    of (no node of its pool yet); 0: such pods are left to the autoscaler's own estimate."""
    image: str = PAUSE_IMAGE
    exclusion: str = "hostname"
    """How a placeholder avoids the existing nodes: ``hostname`` (cluster-autoscaler) or
    ``label`` (Karpenter); see the module docstring."""
    names: ResourceNames = DEFAULT_NAMES
    unit: MemoryUnit = MemoryUnit.GiB

    def __post_init__(self) -> None:
        for field_name, value_name in (
            ("limit", "maxPlaceholders"),
            ("per_namespace", "perNamespace"),
        ):
            value = getattr(self, field_name)
            if value < 0:
                raise ValueError(
                    f"autoscaling.{value_name}={value} is refused: it must be 0 or more "
                    f"(0 makes no placeholders)"
                )
        if self.exclusion not in EXCLUSIONS:
            raise ValueError(
                f"autoscaling.autoscaler gives placeholder exclusion {self.exclusion!r}: it must "
                f"be one of {', '.join(EXCLUSIONS)} (hostname for cluster-autoscaler, label "
                f"for Karpenter)"
            )
        if self.new_node_gpu_mib < 0:
            raise ValueError(
                f"autoscaling.newNodeGpuMemoryMiB={self.new_node_gpu_mib} is refused: it must "
                f"be 0 (unknown) or the MiB of one GPU of the nodes your pools add"
            )


@dataclass(frozen=True)
class Placeholder:
    """A placeholder that exists, as read back from its pod."""

    name: str
    uid: str
    covers: tuple[str, ...]
    created_s: float
    marked: bool
    """Whether it carries ``PodScheduled=False/Unschedulable``."""


@dataclass(frozen=True)
class Planned:
    """A placeholder to create."""

    name: str
    covers: tuple[str, ...]
    pods: tuple[str, ...]
    """``namespace/name`` of the pods it stands for."""
    gpus: int
    manifest: dict[str, Any]


@dataclass(frozen=True)
class Plan:
    """One round: what to create, mark and delete, and why some pods got none."""

    create: tuple[Planned, ...] = ()
    mark: tuple[str, ...] = ()
    """Existing placeholders to mark ``PodScheduled=False/Unschedulable`` (a mark was lost)."""
    delete: tuple[Placeholder, ...] = ()
    covered: Mapping[str, str] = field(default_factory=dict)
    """Pod UID to the placeholder that stands for it, after this plan."""
    left: Mapping[str, str] = field(default_factory=dict)
    """Pod ``namespace/name`` to why no placeholder stands for it."""


def is_placeholder(pod: KubeObject, namespace: str) -> bool:
    """Whether the pod is one of gpushare's placeholders in ``namespace``."""
    return namespace_of(pod) == namespace and labels_of(pod).get(PLACEHOLDER_LABEL) == "true"


def read_placeholder(pod: KubeObject) -> Placeholder:
    """What the plan needs of an existing placeholder pod."""
    covers = tuple(u for u in annotations_of(pod).get(ANN_FOR, "").split(",") if u)
    status = pod.get("status") or {}
    marked = any(
        isinstance(c, Mapping)
        and c.get("type") == "PodScheduled"
        and c.get("status") == "False"
        and c.get("reason") == UNSCHEDULABLE
        for c in (status.get("conditions") or [] if isinstance(status, Mapping) else [])
    )
    return Placeholder(
        name=name_of(pod),
        uid=uid_of(pod),
        covers=covers,
        created_s=created_seconds(pod),
        marked=marked,
    )


def created_seconds(obj: KubeObject) -> float:
    """``metadata.creationTimestamp`` in seconds (the API server's clock); 0 when unreadable."""
    text = meta(obj).get("creationTimestamp")
    if not isinstance(text, str):
        return 0.0
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


@dataclass
class _Bin:
    free_mib: int
    free_core: int
    gpus: int = 1
    uids: list[str] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Item:
    shortfall: Shortfall
    mem_mib: int
    core_pct: int
    gpus: int
    constraints: str


def plan(
    shortfalls: Iterable[Shortfall],
    pods: Mapping[str, KubeObject],
    existing: Sequence[Placeholder],
    nodes: Iterable[str],
    settings: PlaceholderSettings,
    *,
    now_ns: int,
    quiet: Mapping[str, int] | None = None,
) -> Plan:
    """The placeholders the refused pods need now, against those that exist.

    ``pods`` are the pending pods by UID (the state's ``pending``), ``nodes`` the names of
    every GPU node gpushare knows (the new placeholders' ``NotIn``), ``quiet`` when each pod a
    placeholder stands for was first seen pending and not refused (``settings.grace_s``).
    """
    short: dict[str, Shortfall] = {s.uid: s for s in shortfalls if s.uid in pods}
    quiet = quiet or {}
    grace_ns = int(settings.grace_s * 1e9)
    covered: dict[str, str] = {}
    delete: list[Placeholder] = []
    mark: list[str] = []
    for held in existing:
        live = [
            u
            for u in held.covers
            if u in short and short[u].newest_node_s <= held.created_s and u not in covered
        ]
        live += [
            u
            for u in held.covers
            if u not in short and u in pods and now_ns - quiet.get(u, now_ns) < grace_ns
        ]
        if not live:
            delete.append(held)
            continue
        covered.update(dict.fromkeys(live, held.name))
        if not held.marked:
            mark.append(held.name)
    left: dict[str, str] = {}
    items = _items(short, pods, covered, settings, now_ns=now_ns, left=left)
    room = max(settings.limit - (len(existing) - len(delete)), 0)
    node_names = sorted(set(nodes))
    create: list[Planned] = []
    for constraints, gpu_mib, group in _groups(items):
        for bin_ in _pack(group, gpu_mib):
            if len(create) >= room:
                for key in bin_.keys:
                    left[key] = (
                        f"the placeholder limit ({settings.limit}, autoscaling.maxPlaceholders) "
                        f"is reached; it gets one when others are gone"
                    )
                continue
            first = pods[bin_.uids[0]]
            planned = _planned(first, bin_, bin_.gpus, gpu_mib, constraints, node_names, settings)
            create.append(planned)
            covered.update(dict.fromkeys(bin_.uids, planned.name))
    return Plan(
        create=tuple(create), mark=tuple(mark), delete=tuple(delete), covered=covered, left=left
    )


def _items(
    short: Mapping[str, Shortfall],
    pods: Mapping[str, KubeObject],
    covered: Mapping[str, str],
    settings: PlaceholderSettings,
    *,
    now_ns: int,
    left: dict[str, str],
) -> list[_Item]:
    """The refused pods no placeholder stands for yet, settled, within each namespace's share."""
    taken: dict[str, int] = {}
    items: list[_Item] = []
    settle_ns = int(settings.settle_s * 1e9)
    for shortfall in sorted(short.values(), key=lambda s: s.since_ns):
        if shortfall.uid in covered or now_ns - shortfall.since_ns < settle_ns:
            continue
        pod = pods[shortfall.uid]
        request = read_pod(pod, names=settings.names, unit=settings.unit)
        if not isinstance(request, PodRequest) or not request.wants_gpu:
            continue
        gpu_mib = shortfall.gpu_mib or settings.new_node_gpu_mib
        if not gpu_mib:
            left[shortfall.key] = (
                "no node of its pool has been seen and autoscaling.newNodeGpuMemoryMiB is "
                "not set: left to the autoscaler's own estimate"
            )
            continue
        if taken.get(shortfall.namespace, 0) >= settings.per_namespace:
            left[shortfall.key] = (
                f"its namespace has {settings.per_namespace} pods planned this round "
                f"(autoscaling.perNamespace); it is planned in a later one"
            )
            continue
        taken[shortfall.namespace] = taken.get(shortfall.namespace, 0) + 1
        items.append(
            _Item(
                shortfall=shortfall,
                mem_mib=request.mem_per_gpu * settings.unit.mib,
                core_pct=request.core_per_gpu or 0,
                gpus=request.gpu_count,
                constraints=_constraints(pod) + f"|{gpu_mib}",
            )
        )
    return items


def _groups(items: list[_Item]) -> list[tuple[str, int, list[_Item]]]:
    """Pods that may share a GPU: the same placement constraints and GPU size."""
    groups: dict[str, list[_Item]] = {}
    for item in items:
        groups.setdefault(item.constraints, []).append(item)
    return [(key, int(key.rsplit("|", 1)[1]), group) for key, group in sorted(groups.items())]


def _pack(group: list[_Item], gpu_mib: int) -> list[_Bin]:
    """Best fit, largest first, into GPUs of ``gpu_mib`` and 100 % computing power, as
    gpushare's filter would fill a new node's GPUs. A pod spread over several GPUs gets a bin
    of its own, asking for all of them."""
    bins: list[_Bin] = []
    whole: list[_Bin] = []
    for item in sorted(group, key=lambda i: (-i.mem_mib, -i.core_pct, i.shortfall.since_ns)):
        key, uid = item.shortfall.key, item.shortfall.uid
        if item.gpus > 1:
            whole.append(_Bin(0, 0, item.gpus, [uid], [key]))
            continue
        fits = [b for b in bins if b.free_mib >= item.mem_mib and b.free_core >= item.core_pct]
        if fits:
            chosen = min(fits, key=lambda b: (b.free_mib - item.mem_mib, b.free_core))
        else:
            chosen = _Bin(gpu_mib, CORE_PER_GPU)
            bins.append(chosen)
        chosen.free_mib -= item.mem_mib
        chosen.free_core -= item.core_pct
        chosen.uids.append(uid)
        chosen.keys.append(key)
    return bins + whole


def _constraints(pod: KubeObject) -> str:
    """The pod's placement constraints as one comparable text."""
    spec = pod_spec_of(pod)
    affinity = spec.get("affinity") or {}
    node_affinity = affinity.get("nodeAffinity") if isinstance(affinity, Mapping) else None
    required = (
        node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
        if isinstance(node_affinity, Mapping)
        else None
    )
    return json.dumps(
        [spec.get("nodeSelector") or {}, required or {}, spec.get("tolerations") or []],
        sort_keys=True,
        separators=(",", ":"),
    )


def _planned(
    first: KubeObject,
    bin_: _Bin,
    gpus: int,
    gpu_mib: int,
    constraints: str,
    node_names: list[str],
    settings: PlaceholderSettings,
) -> Planned:
    digest = hashlib.sha256(
        "\n".join([*sorted(bin_.uids), constraints, *node_names]).encode()
    ).hexdigest()[:12]
    name = PREFIX + digest
    return Planned(
        name=name,
        covers=tuple(bin_.uids),
        pods=tuple(bin_.keys),
        gpus=gpus,
        manifest=manifest(
            first,
            name=name,
            covers=bin_.uids,
            keys=bin_.keys,
            gpus=gpus,
            gpu_mib=gpu_mib,
            node_names=node_names,
            settings=settings,
        ),
    )


def manifest(
    pod: KubeObject,
    *,
    name: str,
    covers: Sequence[str],
    keys: Sequence[str],
    gpus: int,
    gpu_mib: int,
    node_names: Sequence[str],
    settings: PlaceholderSettings,
) -> dict[str, Any]:
    """The placeholder pod for GPUs the pods ``covers`` need, placed as ``pod`` is."""
    spec = pod_spec_of(pod)
    by_name = settings.exclusion == "hostname"
    not_in: dict[str, Any] = (
        {"key": NAME_FIELD, "operator": "NotIn", "values": list(node_names)}
        if by_name
        else {"key": LABEL_NODE_GPUS_PUBLISHED, "operator": "DoesNotExist"}
    )
    where = "matchFields" if by_name else "matchExpressions"
    affinity = spec.get("affinity") or {}
    node_affinity = affinity.get("nodeAffinity") if isinstance(affinity, Mapping) else None
    required = (
        node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
        if isinstance(node_affinity, Mapping)
        else None
    )
    terms = (required or {}).get("nodeSelectorTerms") if isinstance(required, Mapping) else None
    new_terms: list[dict[str, Any]] = []
    for term in terms if isinstance(terms, list) and terms else [{}]:
        term = dict(term) if isinstance(term, Mapping) else {}
        requirements = list(term.get(where) or [])
        if node_names or not by_name:
            requirements.append(not_in)
        if requirements:
            term[where] = requirements
        new_terms.append(term)
    amount = {settings.names.count: str(gpus)}
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": settings.namespace,
            "labels": {
                PLACEHOLDER_LABEL: "true",
                "app.kubernetes.io/managed-by": "gpushare",
                "app.kubernetes.io/component": "placeholder",
            },
            "annotations": {
                ANN_FOR: ",".join(covers),
                ANN_PODS: ",".join(keys),
                ANN_GPU_MIB: str(gpu_mib),
            },
        },
        "spec": {
            "schedulerName": PLACEHOLDER_SCHEDULER,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 0,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 65535,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "gpu",
                    "image": settings.image,
                    "resources": {"requests": amount, "limits": amount},
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                        "readOnlyRootFilesystem": True,
                    },
                }
            ],
        },
    }
    selector = spec.get("nodeSelector")
    if isinstance(selector, Mapping) and selector:
        body["spec"]["nodeSelector"] = dict(selector)
    if any(t for t in new_terms):
        body["spec"]["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": new_terms}
            }
        }
    tolerations = spec.get("tolerations")
    if isinstance(tolerations, list) and tolerations:
        body["spec"]["tolerations"] = list(tolerations)
    return body


def mark_status(pods: Sequence[str]) -> dict[str, Any]:
    """The status patch that tells an autoscaler a placeholder needs room."""
    shown = ", ".join(pods[:3]) + (f" and {len(pods) - 3} more" if len(pods) > 3 else "")
    return {
        "status": {
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": UNSCHEDULABLE,
                    "message": MARK_MESSAGE.format(pods=shown or "its pods"),
                }
            ]
        }
    }
