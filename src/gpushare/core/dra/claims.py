"""The claim a pod's ACK resources become in DRA mode (docs/dra.md "From ACK resources to a claim").

A manifest written for ACK asks ``aliyun.com/gpu-mem`` (and ``aliyun.com/gpu-core.percentage``)
under ``limits``; on a DRA node nothing advertises those names, so the webhook rewrites the pod
into what DRA understands, and the seeds run as written:

- ``spec.resourceClaims: [{name: gpushare, resourceClaimTemplateName: gpushare-<hash>}]``, and in
  each GPU container the ACK resources removed and ``resources.claims`` naming its request(s);
- a ``ResourceClaimTemplate`` with one request per GPU container, named after the container:
  ``exactly {deviceClassName: gpu.gpushare.io, allocationMode: ExactCount, count, capacity}``;
- the annotation ``gpushare.io/dra-requests`` (what the manifest asked) and the scheduling gate
  ``gpushare.io/dra-allocation``, which gpushare's allocator lifts.

**Which pods.** The request is read and checked by ``core.model.requests.read_pod``, the rules
the validating webhook and the extender apply: a request it refuses is left as written
(``Rejection``), so the validating webhook refuses it with the same reasons in either mode. A pod
that names claims itself (``spec.resourceClaims``) is left alone: its claims are its own, and the
chart's ValidatingAdmissionPolicy bounds what they may ask. Whether a pod is in DRA mode at all
is ``selection``: its namespace labelled ``gpushare.io/allocation-mode=dra`` (the API server
selects those for the webhook), its node selector or required node affinity demanding that node
label, or the chart's ``dra.defaultMode: dra``.

**Memory.** ``gpu-mem`` counts units of the DRA memory unit (``dra.memoryUnit``, 1 GiB or
128 MiB); each device of a request asks ``units x unit`` as a quantity, which the slice's request
policy (step = the node's unit) keeps exact. A pod labelled ``aliyun.com/gpu-count: N`` spreads
each container over N distinct GPUs as device-plugin mode does (``core.model.spreading``): a
container whose amount divides by N is one request of ``count: N``; one that does not gets one
request per distinct share (``<container>``, ``<container>-1``), all kept on distinct GPUs by a
``distinctAttribute: gpushare.io/uuid`` constraint over that container's requests. A claim's
requests all hold capacity for the pod's life, so an ordinary init container's memory is held
beside the app containers' (device-plugin mode counts the larger of the two): the claim's memory
is the containers' sum.

**Computing power.** ``gpu-core.percentage`` becomes ``capacity.requests.cores`` per device, and
a CEL selector keeps the request on ``core_mem`` GPUs, the only mode that enforces it.

Pure: the webhook adapter creates the template and sends the patch.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpushare.core.dra.slices import SLICE_API_VERSION, quantity
from gpushare.core.model.inventory import Mode
from gpushare.core.model.kubejson import KubeObject, namespace_of, pod_spec_of
from gpushare.core.model.names import (
    ALLOCATION_MODE_DRA,
    ANN_DRA_REQUESTS,
    DEFAULT_NAMES,
    DRA_CAPACITY_CORES,
    DRA_CAPACITY_MEMORY,
    DRA_CLAIM_NAME,
    DRA_DEVICE_CLASS,
    DRA_DRIVER,
    DRA_SCHEDULING_GATE,
    LABEL_ALLOCATION_MODE,
    LABEL_POD_GPU_COUNT,
    ResourceNames,
)
from gpushare.core.model.requests import PodRequest, Rejection, read_pod
from gpushare.core.model.units import MemoryUnit

TEMPLATE_PREFIX = f"{DRA_CLAIM_NAME}-"
"""Every template the webhook makes is ``gpushare-<hash of its spec>``."""
HASH_CHARS = 10
"""Hex digits of the shape's hash: 40 bits, so two shapes of one namespace never collide in
practice (a collision is caught: ``webhook.dratemplates`` compares the stored spec)."""
UNIQUE_ATTRIBUTE = f"{DRA_DRIVER}/uuid"
"""The attribute ``distinctAttribute`` compares: one device per GPU."""
CORE_MEM_SELECTOR = f'device.attributes["{DRA_DRIVER}"].mode == "{Mode.CORE_MEM.value}"'
"""CEL: only ``core_mem`` GPUs enforce computing power, as device-plugin mode's filter requires."""
GATED_PATHS = ("/spec/schedulingGates", "/metadata/annotations")
"""What ``convert(gate=False)`` leaves out: the gate, and the annotation that goes with it."""
MAX_NAME = 63
"""Request names are DNS labels."""


@dataclass(frozen=True)
class ClaimRequest:
    """One request of the template: ``count`` devices, each with this memory and computing power."""

    name: str
    container: str
    count: int
    mem_units: int
    core_pct: int = 0
    cores_asked: bool = False
    """Whether the container asks computing power (then ``cores`` is requested and the selector
    keeps it on core_mem GPUs, even on a GPU where its share rounds to 0)."""

    def as_json(self, unit: MemoryUnit) -> dict[str, Any]:
        """The request as the template holds it."""
        capacity: dict[str, str] = {DRA_CAPACITY_MEMORY: quantity(self.mem_units * unit.mib)}
        exactly: dict[str, Any] = {
            "deviceClassName": DRA_DEVICE_CLASS,
            "allocationMode": "ExactCount",
            "count": self.count,
        }
        if self.cores_asked:
            capacity[DRA_CAPACITY_CORES] = str(self.core_pct)
            exactly["selectors"] = [{"cel": {"expression": CORE_MEM_SELECTOR}}]
        exactly["capacity"] = {"requests": capacity}
        return {"name": self.name, "exactly": exactly}


@dataclass(frozen=True)
class Conversion:
    """A pod converted: the template to create in its namespace and the patch for the pod."""

    template: dict[str, Any]
    patch: tuple[dict[str, Any], ...]
    requests: tuple[ClaimRequest, ...]
    unit: MemoryUnit

    @property
    def template_name(self) -> str:
        """``gpushare-<hash>``: the same shape in the same namespace shares one template."""
        return str(self.template["metadata"]["name"])

    @property
    def mem_mib(self) -> int:
        """Memory the claim asks in all, over every device of every request."""
        return sum(r.count * r.mem_units * self.unit.mib for r in self.requests)


@dataclass(frozen=True)
class Untouched:
    """The pod is left as written, and why (for the webhook's log)."""

    reason: str


Outcome = Conversion | Untouched | Rejection


def demanded_by_pod(pod: KubeObject) -> str:
    """Why the pod itself demands DRA nodes ("" when it does not).

    It does when its ``nodeSelector`` names ``gpushare.io/allocation-mode: dra``, or when every
    term of its required node affinity requires that value (terms are ORed: one term without it
    lets the pod onto device-plugin nodes, where a claim could not be served).
    """
    spec = pod_spec_of(pod)
    selector = spec.get("nodeSelector") or {}
    if selector.get(LABEL_ALLOCATION_MODE) == ALLOCATION_MODE_DRA:
        return f"its nodeSelector names {LABEL_ALLOCATION_MODE}={ALLOCATION_MODE_DRA}"
    affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = required.get("nodeSelectorTerms") or []
    if terms and all(_term_demands(term) for term in terms):
        return f"its required node affinity demands {LABEL_ALLOCATION_MODE}={ALLOCATION_MODE_DRA}"
    return ""


def _term_demands(term: Mapping[str, Any]) -> bool:
    for expression in term.get("matchExpressions") or []:
        if (
            expression.get("key") == LABEL_ALLOCATION_MODE
            and expression.get("operator") == "In"
            and list(expression.get("values") or []) == [ALLOCATION_MODE_DRA]
        ):
            return True
    return False


def selection(pod: KubeObject, *, namespace_selected: bool, default_dra: bool) -> str:
    """Why the pod is in DRA mode ("" when it is not): namespace, the pod's own nodes, or the
    cluster-wide default, in that order."""
    if namespace_selected:
        return f"its namespace is labelled {LABEL_ALLOCATION_MODE}={ALLOCATION_MODE_DRA}"
    demanded = demanded_by_pod(pod)
    if demanded:
        return demanded
    return "the cluster's default mode is dra (dra.defaultMode)" if default_dra else ""


def _request_names(container: str, groups: int, taken: set[str]) -> list[str]:
    """``<container>``, then ``<container>-1`` ... for its further shares, never a name taken."""
    names: list[str] = []
    for k in range(groups):
        suffix = f"-{k}" if k else ""
        name = f"{container[: MAX_NAME - len(suffix)]}{suffix}"
        n = 0
        while name in taken:
            n += 1
            extra = f"-{k}x{n}"
            name = f"{container[: MAX_NAME - len(extra)]}{extra}"
        taken.add(name)
        names.append(name)
    return names


def claim_requests(request: PodRequest) -> tuple[ClaimRequest, ...]:
    """One request per distinct (memory, cores) share of each GPU container, over its GPUs."""
    taken = {c.name for c in request.containers}
    out: list[ClaimRequest] = []
    for container, mem_layout, core_layout in zip(
        request.containers, request.mem_layouts, request.core_layouts, strict=True
    ):
        shares: dict[tuple[int, int], int] = {}
        for mem, core in zip(mem_layout, core_layout, strict=True):
            if mem > 0:  # a GPU where the container holds nothing is not one of its devices
                shares[(mem, core)] = shares.get((mem, core), 0) + 1
        ordered = sorted(shares.items(), key=lambda item: (-item[0][0], -item[0][1]))
        taken.discard(container.name)
        names = _request_names(container.name, len(ordered), taken)
        for name, ((mem, core), count) in zip(names, ordered, strict=True):
            out.append(
                ClaimRequest(
                    name=name,
                    container=container.name,
                    count=count,
                    mem_units=mem,
                    core_pct=core,
                    cores_asked=container.core_pct > 0,
                )
            )
    return tuple(out)


def template_spec(requests: Sequence[ClaimRequest], unit: MemoryUnit) -> dict[str, Any]:
    """The ResourceClaimTemplate's ``spec`` (a ResourceClaimSpec under ``spec``)."""
    devices: dict[str, Any] = {"requests": [r.as_json(unit) for r in requests]}
    constraints: list[dict[str, Any]] = []
    for container in dict.fromkeys(r.container for r in requests):
        mine = [r for r in requests if r.container == container]
        if sum(r.count for r in mine) > 1:
            constraints.append(
                {"requests": [r.name for r in mine], "distinctAttribute": UNIQUE_ATTRIBUTE}
            )
    if constraints:
        devices["constraints"] = constraints
    return {"spec": {"devices": devices}}


def template_name(spec: Mapping[str, Any]) -> str:
    """``gpushare-<hash>`` of the template's spec: stable across webhook replicas and restarts."""
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return TEMPLATE_PREFIX + hashlib.sha256(canonical.encode()).hexdigest()[:HASH_CHARS]


def build_template(
    requests: Sequence[ClaimRequest], unit: MemoryUnit, namespace: str
) -> dict[str, Any]:
    """The ResourceClaimTemplate for these requests in ``namespace``."""
    spec = template_spec(requests, unit)
    return {
        "apiVersion": SLICE_API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": template_name(spec),
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "gpushare"},
        },
        "spec": spec,
    }


def _pointer(key: str) -> str:
    """A map key as one JSON-pointer segment (RFC 6901: ``~`` then ``/`` escaped)."""
    return key.replace("~", "~0").replace("/", "~1")


def asked_json(request: PodRequest, unit: MemoryUnit, names: ResourceNames) -> str:
    """``gpushare.io/dra-requests``: what the manifest asked, as the containers wrote it."""
    containers: dict[str, dict[str, int]] = {}
    for c in request.containers:
        asked = {names.mem: c.mem_units}
        if c.core_pct:
            asked[names.core] = c.core_pct
        containers[c.name] = asked
    shown = {"unit": unit.value, LABEL_POD_GPU_COUNT: request.gpu_count, "containers": containers}
    return json.dumps(shown, sort_keys=True, separators=(",", ":"))


def _patch(
    pod: KubeObject,
    request: PodRequest,
    requests: Sequence[ClaimRequest],
    name: str,
    annotation: str,
    names: ResourceNames,
) -> list[dict[str, Any]]:
    spec: Mapping[str, Any] = pod.get("spec") or {}
    ops: list[dict[str, Any]] = [
        {
            "op": "add",
            "path": "/spec/resourceClaims",
            "value": [{"name": DRA_CLAIM_NAME, "resourceClaimTemplateName": name}],
        }
    ]
    by_container: dict[str, list[str]] = {}
    for r in requests:
        by_container.setdefault(r.container, []).append(r.name)
    gpu = {c.name for c in request.containers}
    for kind in ("initContainers", "containers"):
        for position, container in enumerate(spec.get(kind) or []):
            cname = str(container.get("name") or "")
            if cname not in gpu:
                continue
            at = f"/spec/{kind}/{position}/resources"
            resources = container.get("resources") or {}
            for field in ("limits", "requests"):
                for resource in (names.mem, names.core):
                    if resource in (resources.get(field) or {}):
                        ops.append({"op": "remove", "path": f"{at}/{field}/{_pointer(resource)}"})
            claims = [
                {"name": DRA_CLAIM_NAME, "request": rname} for rname in by_container.get(cname, [])
            ]
            if "claims" in resources:
                ops += [{"op": "add", "path": f"{at}/claims/-", "value": c} for c in claims]
            else:
                ops.append({"op": "add", "path": f"{at}/claims", "value": claims})
    metadata = pod.get("metadata") or {}
    if metadata.get("annotations"):
        ops.append(
            {
                "op": "add",
                "path": f"/metadata/annotations/{_pointer(ANN_DRA_REQUESTS)}",
                "value": annotation,
            }
        )
    else:
        value = {ANN_DRA_REQUESTS: annotation}
        ops.append({"op": "add", "path": "/metadata/annotations", "value": value})
    gate = {"name": DRA_SCHEDULING_GATE}
    gates = (pod.get("spec") or {}).get("schedulingGates")
    if gates:
        if not any(g.get("name") == DRA_SCHEDULING_GATE for g in gates):
            ops.append({"op": "add", "path": "/spec/schedulingGates/-", "value": gate})
    else:
        ops.append({"op": "add", "path": "/spec/schedulingGates", "value": [gate]})
    return ops


def convert(
    pod: KubeObject,
    *,
    unit: MemoryUnit = MemoryUnit.GiB,
    names: ResourceNames = DEFAULT_NAMES,
    gate: bool = True,
) -> Outcome:
    """The conversion of a pod in DRA mode: a ``Conversion``, or why it is left as written.

    ``gate=False`` leaves the scheduling gate (and the annotation) off, for a cluster without
    gpushare's allocator (the stock allocator then places the claim first-fit).
    """
    spec = pod_spec_of(pod)
    if spec.get("resourceClaims"):
        return Untouched(
            "the pod names its own claims (spec.resourceClaims); gpushare leaves it as written"
        )
    read = read_pod(pod, names=names, unit=unit)
    if isinstance(read, Rejection):
        return read
    if not read.wants_gpu:
        return Untouched(f"no container asks for {names.mem}")
    requests = claim_requests(read)
    template = build_template(requests, unit, namespace_of(pod))
    name = str(template["metadata"]["name"])
    ops = _patch(pod, read, requests, name, asked_json(read, unit, names), names)
    if not gate:  # the annotation goes with the gate: the tampering rules accept it only beside it
        ops = [op for op in ops if not op["path"].startswith(GATED_PATHS)]
    return Conversion(template=template, patch=tuple(ops), requests=requests, unit=unit)
