"""gpushare's allocation of a DRA claim: the node and GPUs device-plugin mode would choose.

The stock allocator takes the first device that fits in published order (docs/dra.md). In DRA
mode the webhook gates the pod (``gpushare.io/dra-allocation``) and gpushare's allocator places
it with the same placement code as device-plugin mode: the claim's requests become a
``PodRequest`` (``claim_request``), every candidate node is filtered and scored by the
``Placer`` (the extender's ``core.decision.scheduling.Scheduler``: binpack or spread per node
label, the fragmentation-aware policy inside a node), the best score wins with ties to the first
node given (the adapter gives them in name order: ``core.placement.ranking.single_top``'s rule),
and ``allocation_status`` writes the claim's ``status`` as kube-scheduler's own allocator would
(checked against kubernetes v1.36.3):

- ``status.allocation.devices.results[]``: ``request``, ``driver``, ``pool`` (= the node),
  ``device`` (``gpu-<index>``), ``consumedCapacity`` and ``shareID`` on a device that allows
  multiple allocations. ``shareID`` must be an RFC 4122 UUID in lowercase
  (pkg/apis/resource/validation/validation.go ``validateDeviceRequestAllocationResult`` ->
  ``validateUID``). kube-scheduler counts an allocated result with a ``shareID`` as a share of the
  device consuming its ``consumedCapacity``, and one without as the whole device taken
  (pkg/scheduler/framework/plugins/dynamicresources/allocateddevices.go), so both must be
  written for stock claims to see gpushare's shares and the rest of the GPU.
- ``status.allocation.nodeSelector``: ``matchFields metadata.name In [node]``; the scheduler's
  dynamicresources PreFilter reads an allocated claim's node selector as where the pod may go
  (pkg/scheduler/framework/plugins/dynamicresources/dynamicresources.go, ``availableOnNodes``)
  and does not allocate it again.
- ``status.reservedFor: [the pod]``: the resourceclaim controller deallocates a claim when its
  last ``reservedFor`` entry goes away (pod deleted, replaced or done), but only when the claim
  carries the finalizer ``resource.kubernetes.io/delete-protection``
  (pkg/controller/resourceclaim/controller.go ``syncClaim``). The adapter therefore adds that
  finalizer before it writes the status (as the scheduler's PreBind does), so deleting the pod
  frees the capacity and a claim in use cannot be deleted under it.

Node fit: the allocator pins the claim to one node, so it must never choose a node the
scheduler will refuse. ``node_refusal`` checks what it can see: the node is schedulable, the
pod tolerates its ``NoSchedule``/``NoExecute`` taints, its ``nodeSelector`` and required node
affinity match, and the pod's CPU, memory and one more pod fit the allocatable left.

ResourcePolicy: the caller may narrow the nodes that fit (``Narrowing``; the extender passes the
ResourcePolicy filter of ``core.resourcepolicies.policyplugin``, which this layer may not import),
as kube-scheduler's filter chain runs the extender's ResourcePolicy filter after the fit. GPUs
that fit on nodes the narrowing left out are not a refusal but a wait (``Held``): the pod keeps
its gate, since without it the scheduler's own allocator would place the claim first-fit on any
node, the policy's or not.

Pure: no I/O; outcomes are values (``Allocated``, ``Refused``, ``Held``, ``NotOurs``) with
reasons.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gpushare.core.booking.ledger import Ledger
from gpushare.core.dra.claims import CORE_MEM_SELECTOR
from gpushare.core.dra.slices import device_name, quantity
from gpushare.core.model.containers import ContainerKind
from gpushare.core.model.gpumodel import pod_models
from gpushare.core.model.hostresources import HostResources, pod_requests
from gpushare.core.model.inventory import NodeInventory
from gpushare.core.model.kubejson import (
    KubeObject,
    key_of,
    labels_of,
    name_of,
    namespace_of,
    node_status_of,
    pod_spec_of,
    spec_of,
    uid_of,
)
from gpushare.core.model.names import (
    DRA_CAPACITY_CORES,
    DRA_CAPACITY_MEMORY,
    DRA_DEVICE_CLASS,
    DRA_DRIVER,
)
from gpushare.core.model.quantity import parse_quantity
from gpushare.core.model.requests import CORE_STEP, ContainerRequest, PodRequest
from gpushare.core.model.units import MemoryUnit
from gpushare.core.placement.filtering import Verdict
from gpushare.core.records.allocation import Allocation, plan

MIB = 1024 * 1024
FINALIZER = "resource.kubernetes.io/delete-protection"
"""``resourceapi.Finalizer`` (k8s.io/api v0.36 resource/v1): without it the resourceclaim
controller never clears an allocation (pkg/controller/resourceclaim/controller.go)."""
SHARE_NAMESPACE = uuid.UUID("7f1f3c52-6a57-4c1e-9d0e-4f7d3b0a9a61")
"""Namespace of the name-based UUIDs gpushare gives its shares (stable for a claim's result, so
writing the same allocation twice writes the same status)."""


class Placer(Protocol):
    """What the allocator needs of the extender's scheduler core: one node's verdict (with the
    GPUs chosen) and its score, over a ledger. ``Scheduler`` fits structurally."""

    def verdict(
        self,
        request: PodRequest,
        node: NodeInventory,
        ledger: Ledger,
        *,
        cluster: Mapping[str, NodeInventory] | None = None,
    ) -> Verdict: ...

    def score(
        self,
        request: PodRequest,
        node: NodeInventory,
        ledger: Ledger,
        *,
        verdict: Verdict | None = None,
        cluster: Mapping[str, NodeInventory] | None = None,
    ) -> float: ...


@dataclass(frozen=True)
class ClaimRequest:
    """One request of a gpushare claim (``spec.devices.requests[]`` with ``exactly``)."""

    name: str
    count: int
    memory_bytes: int
    cores: int


@dataclass(frozen=True)
class NodeView:
    """A candidate node as the allocator sees it: its inventory (``DraLedger.inventory``), the
    Node object, and the CPU, memory and pods already requested there."""

    inventory: NodeInventory
    node: KubeObject
    used: HostResources
    pods: int


@dataclass(frozen=True)
class Allocated:
    """The node and GPUs chosen, and the claim status to write."""

    node: str
    allocation: Allocation
    status: dict[str, Any]


@dataclass(frozen=True)
class Refused:
    """No node fits now; ``reasons`` per node (sentences), for the event and the log."""

    reasons: tuple[str, ...]

    @property
    def message(self) -> str:
        """The reasons in one line."""
        return "; ".join(self.reasons)


@dataclass(frozen=True)
class Held:
    """GPUs fit on some nodes, but the narrowing (a ResourcePolicy) keeps the pod off all of
    them now; ``reasons`` per node, as ``Refused``'s."""

    reasons: tuple[str, ...]

    @property
    def message(self) -> str:
        """The reasons in one line."""
        return "; ".join(self.reasons)


@dataclass(frozen=True)
class NotOurs:
    """A claim gpushare does not allocate (another class, another shape); the scheduler's own
    allocator takes it once the gate is gone."""

    reason: str


Outcome = Allocated | Refused | Held | NotOurs


class Narrowing(Protocol):
    """What keeps only some of the nodes that fit (the extender's ResourcePolicy filter): the
    names kept, in the order given, with a sentence in ``failed`` for each node left out."""

    def __call__(
        self, pod: KubeObject, fitting: list[str], failed: dict[str, str]
    ) -> list[str]: ...


def _bytes(raw: Any) -> int | None:
    parsed = parse_quantity(raw)
    if isinstance(parsed, str) or parsed.value < 0:
        return None
    return math.ceil(parsed.value)


def read_requests(claim: KubeObject) -> tuple[ClaimRequest, ...] | NotOurs:
    """The claim's requests, when every one is a gpushare request the allocator can place:
    ``exactly`` from class ``gpu.gpushare.io``, ``ExactCount``, with memory requested."""
    requests = ((spec_of(claim).get("devices") or {}).get("requests")) or []
    if not requests:
        return NotOurs(f"claim {key_of(claim)}: spec.devices.requests is empty")
    out: list[ClaimRequest] = []
    for position, raw in enumerate(requests):
        where = f"claim {key_of(claim)}: spec.devices.requests[{position}]"
        exactly = raw.get("exactly") if isinstance(raw, Mapping) else None
        if not isinstance(exactly, Mapping):
            return NotOurs(f"{where} has no 'exactly' (prioritized lists are the scheduler's)")
        if exactly.get("deviceClassName") != DRA_DEVICE_CLASS:
            return NotOurs(
                f"{where}.exactly.deviceClassName={exactly.get('deviceClassName')!r} is not "
                f"{DRA_DEVICE_CLASS}"
            )
        if exactly.get("allocationMode", "ExactCount") != "ExactCount":
            return NotOurs(f"{where}.exactly.allocationMode must be ExactCount")
        selectors = exactly.get("selectors") or []
        if selectors and selectors != [{"cel": {"expression": CORE_MEM_SELECTOR}}]:
            # the webhook writes only the core_mem selector, which the placement's own mode
            # rule enforces (core.placement.filtering); any other CEL is the scheduler's
            return NotOurs(f"{where}.exactly.selectors: CEL selectors are the scheduler's")
        count = exactly.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            return NotOurs(f"{where}.exactly.count={count!r} must be an integer >= 1")
        capacity = (exactly.get("capacity") or {}).get("requests") or {}
        if DRA_CAPACITY_MEMORY not in capacity:
            return NotOurs(
                f"{where}.exactly.capacity.requests.memory is not set: a whole-GPU request is "
                "the scheduler's to allocate"
            )
        memory = _bytes(capacity[DRA_CAPACITY_MEMORY])
        cores = _bytes(capacity.get(DRA_CAPACITY_CORES, 0))
        if memory is None or memory == 0 or cores is None or cores > 100:
            return NotOurs(
                f"{where}.exactly.capacity.requests={dict(capacity)!r}: memory must be a "
                "positive quantity and cores 0..100"
            )
        out.append(ClaimRequest(str(raw.get("name", "")), count, memory, cores))
    counts = {r.count for r in out}
    if len(counts) > 1:
        # the webhook splits a container whose memory does not divide over its GPUs into one
        # request per distinct share (core.dra.claims); those are left to the scheduler's
        # allocator until the placement reads them back into one container
        return NotOurs(f"claim {key_of(claim)}: requests ask different GPU counts {sorted(counts)}")
    return tuple(out)


def claim_request(
    pod: KubeObject, requests: Sequence[ClaimRequest], unit: MemoryUnit
) -> PodRequest:
    """The pod's request as the placement code reads it: one container per claim request,
    memory rounded up to ``unit`` and cores to steps of 5, as the API server's allocator rounds
    them against the slice's ``requestPolicy`` (docs/dra.md)."""
    count = requests[0].count
    containers = tuple(
        ContainerRequest(
            name=r.name,
            kind=ContainerKind.APP,
            mem_units=math.ceil(r.memory_bytes / (unit.mib * MIB)) * count,
            core_pct=math.ceil(r.cores / CORE_STEP) * CORE_STEP * count,
        )
        for r in requests
    )
    return PodRequest(
        namespace=namespace_of(pod),
        name=name_of(pod),
        uid=uid_of(pod),
        containers=containers,
        gpu_count=count,
        mem_units=sum(c.mem_units for c in containers),
        core_pct=sum(c.core_pct for c in containers),
        host=pod_requests(pod),
        models=pod_models(pod),
    )


def _tolerated(taint: Mapping[str, Any], tolerations: Sequence[Any]) -> bool:
    """Whether one toleration matches the taint (core/v1 ``Toleration.ToleratesTaint``)."""
    for raw in tolerations:
        if not isinstance(raw, Mapping):
            continue
        effect = raw.get("effect") or ""
        if effect and effect != taint.get("effect"):
            continue
        key = raw.get("key") or ""
        operator = raw.get("operator") or "Equal"
        if operator == "Exists":
            if not key or key == taint.get("key"):
                return True
        elif key == taint.get("key") and (raw.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def _expression_matches(expression: Mapping[str, Any], values_of: Mapping[str, str]) -> bool:
    key = str(expression.get("key", ""))
    operator = expression.get("operator")
    values = [str(v) for v in expression.get("values") or []]
    present = key in values_of
    value = values_of.get(key, "")
    if operator == "In":
        return present and value in values
    if operator == "NotIn":
        return not present or value not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and len(values) == 1:
        try:
            left, right = int(value), int(values[0])
        except ValueError:
            return False
        return left > right if operator == "Gt" else left < right
    return False


def _term_matches(term: Mapping[str, Any], labels: Mapping[str, str], name: str) -> bool:
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False  # an empty term matches nothing (component-helpers nodeaffinity)
    return all(_expression_matches(e, labels) for e in expressions) and all(
        _expression_matches(f, {"metadata.name": name}) for f in fields
    )


def node_refusal(pod: KubeObject, view: NodeView) -> str | None:
    """Why kube-scheduler would refuse the pod on the node whatever the GPUs (None: it would
    not, as far as the allocator sees): unschedulable, untolerated taints, node selector and
    required affinity, CPU, memory and pod count (NodeUnschedulable, TaintToleration,
    NodeAffinity, NodeResourcesFit in pkg/scheduler/framework/plugins)."""
    node = view.node
    name = name_of(node)
    spec = spec_of(node)
    pod_spec = pod_spec_of(pod)
    raw_tolerations = pod_spec.get("tolerations")
    tolerations: list[Any] = list(raw_tolerations) if isinstance(raw_tolerations, list) else []
    if spec.get("unschedulable") and not _tolerated(
        {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}, tolerations
    ):
        return f"node {name} is unschedulable (cordoned)"
    for taint in spec.get("taints") or []:
        if not isinstance(taint, Mapping) or taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not _tolerated(taint, tolerations):
            return (
                f"node {name} has taint {taint.get('key')}={taint.get('value', '')}:"
                f"{taint.get('effect')} that the pod does not tolerate"
            )
    labels = labels_of(node)
    for key, value in (pod_spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return f"node {name} does not match the pod's nodeSelector {key}={value}"
    required = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") if isinstance(required, Mapping) else None
    if terms and not any(_term_matches(t, labels, name) for t in terms if isinstance(t, Mapping)):
        return f"node {name} does not match the pod's required node affinity"
    allocatable = view.inventory.host
    wants = pod_requests(pod)
    left = allocatable - view.used
    if allocatable.cpu_milli and wants.cpu_milli > left.cpu_milli:
        return f"node {name}: {left.cpu_milli}m CPU left < {wants.cpu_milli}m requested"
    if allocatable.memory_bytes and wants.memory_bytes > left.memory_bytes:
        return (
            f"node {name}: {left.memory_bytes // MIB}Mi memory left < "
            f"{wants.memory_bytes // MIB}Mi requested"
        )
    pods = _int((node_status_of(node).get("allocatable") or {}).get("pods"))
    if pods is not None and view.pods + 1 > pods:
        return f"node {name}: {view.pods}/{pods} pods, no room for one more"
    return None


def _int(raw: Any) -> int | None:
    amount = _bytes(raw) if raw is not None else None
    return amount


def share_id(claim_uid: str, request: str, device: str) -> str:
    """The shareID of one result: stable per claim, request and device, a lowercase UUID."""
    return str(uuid.uuid5(SHARE_NAMESPACE, f"{claim_uid}/{request}/{device}"))


def allocation_status(
    claim: KubeObject, pod: KubeObject, allocation: Allocation, *, unit: MemoryUnit
) -> dict[str, Any]:
    """The claim's ``status`` that records ``allocation`` (see the module docstring): one
    result per request and GPU, the node selector, and the pod in ``reservedFor``."""
    claim_uid = uid_of(claim)
    results = []
    for container in allocation.containers:
        for share in container.gpus:
            device = device_name(share.index)
            results.append(
                {
                    "request": container.name,
                    "driver": DRA_DRIVER,
                    "pool": allocation.node,
                    "device": device,
                    "shareID": share_id(claim_uid, container.name, device),
                    "consumedCapacity": {
                        DRA_CAPACITY_MEMORY: quantity(share.mem_units * unit.mib),
                        DRA_CAPACITY_CORES: str(share.core_pct),
                    },
                }
            )
    return {
        "allocation": {
            "devices": {"results": results},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": [allocation.node]}
                        ]
                    }
                ]
            },
        },
        "reservedFor": [{"resource": "pods", "name": name_of(pod), "uid": uid_of(pod)}],
    }


def allocate(
    pod: KubeObject,
    claim: KubeObject,
    nodes: Sequence[NodeView],
    ledger: Ledger,
    placer: Placer,
    *,
    unit: MemoryUnit,
    cluster: Mapping[str, NodeInventory] | None = None,
    requests: tuple[ClaimRequest, ...] | None = None,
    fits: Callable[[KubeObject, NodeView], str | None] = node_refusal,
    narrow: Narrowing | None = None,
) -> Outcome:
    """Choose the node and GPUs for the pod's claim (see the module docstring). Nothing is
    booked: the caller books the ``Allocated.allocation`` (``Ledger.claim``) once written."""
    if requests is None:
        read = read_requests(claim)
        if isinstance(read, NotOurs):
            return read
        requests = read
    request = claim_request(pod, requests, unit)
    fitting: list[tuple[float, NodeView, Verdict]] = []
    reasons: list[str] = []
    for view in nodes:
        refusal = fits(pod, view)
        if refusal is not None:
            reasons.append(refusal)
            continue
        verdict = placer.verdict(request, view.inventory, ledger, cluster=cluster)
        if not verdict.fits:
            reasons.append(f"node {view.inventory.name}: {verdict.message}")
            continue
        score = placer.score(request, view.inventory, ledger, verdict=verdict, cluster=cluster)
        fitting.append((score, view, verdict))
    if fitting and narrow is not None:
        failed: dict[str, str] = {}
        kept = set(narrow(pod, [view.inventory.name for _, view, _ in fitting], failed))
        left_out = [(n, why) for n, why in failed.items() if n not in kept]
        fitting = [f for f in fitting if f[1].inventory.name in kept]
        if not fitting:
            return Held(_grouped(left_out))
    # max keeps the first of equal scores: ties go to the first node given
    best = max(fitting, key=lambda candidate: candidate[0], default=None)
    if best is None:
        return Refused(tuple(reasons) or ("no node in DRA mode publishes gpushare GPUs",))
    _, view, verdict = best
    name = view.inventory.name
    allocation = plan(request, node=name, indexes=verdict.gpus, unit=view.inventory.unit)
    holding = Allocation(
        uid=uid_of(claim),
        namespace=namespace_of(claim),
        name=name_of(claim),
        node=name,
        unit=allocation.unit,
        gpus=allocation.gpus,
        containers=allocation.containers,
        assigned=True,
    )
    status = allocation_status(claim, pod, holding, unit=view.inventory.unit)
    return Allocated(node=name, allocation=holding, status=status)


def _grouped(reasons: Sequence[tuple[str, str]]) -> tuple[str, ...]:
    """One sentence per distinct reason, naming its nodes (a policy gives every node of a unit
    the same reason; a hundred copies of it would only hide it)."""
    nodes: dict[str, list[str]] = {}
    for name, why in reasons:
        nodes.setdefault(why, []).append(name)
    return tuple(
        f"node{'s' if len(names) > 1 else ''} {', '.join(names)}: {why}"
        for why, names in nodes.items()
    )
