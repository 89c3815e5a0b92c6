"""What ``NodePrepareResources`` hands a claim's containers: pure, no gRPC, API or files.

kubelet names a claim (namespace, name, UID); the driver reads it from the API server and gives
it here. Its ``status.allocation.devices.results`` say which device of which pool each request
got and, with consumable capacity (KEP-5075, k8s.io/api v0.36 ``resource/v1``
``DeviceRequestAllocationResult.consumedCapacity``), how much of it: ``memory`` (a quantity,
a whole number of the node's unit since the slice's request policy steps by it) and ``cores``
(percent). Only results of this driver in this node's pool are ours; a claim may hold others'.

Each request becomes the signature the device plugin would have resolved for a container asking
the same (``core.records.handoff.Signature``): its GPUs, the memory units and percent on each,
and the claim's memory as the pod's. The container's environment and CDI devices then come from
the same code as the device plugin's answer (``node.handout.container_answer``), so both modes
hand over ``NVIDIA_VISIBLE_DEVICES``, ``ALIYUN_COM_GPU_MEM_*`` and ``GPUSHARE_*`` alike. The
isolation hook's additions (interposer, limits, schedules) are made by the caller, which owns
the files; :func:`claim_spec` then writes the whole answer as one CDI spec, one CDI device per
request, which kubelet passes to the runtime with the GPUs' own CDI devices.

cGPU policy 2's weight comes from the pod spec as in device-plugin mode
(``ALIYUN_COM_GPU_SCHD_WEIGHT`` in the ``env`` of the containers that use the request,
``isolation.policy.weight_from_env``), from the pods the claim is reserved for; where several
containers use one request, the lowest weight is given, so no container gets more than its spec
asks.

A claim that cannot be served is a ``Refusal`` with the reason kubelet shows on the pod.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from gpushare.core.dra.slices import index_of
from gpushare.core.model.inventory import Mode
from gpushare.core.model.kubejson import KubeObject, name_of, namespace_of, uid_of
from gpushare.core.model.names import DRA_CAPACITY_CORES, DRA_CAPACITY_MEMORY, DRA_DRIVER
from gpushare.core.model.quantity import parse_quantity
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.handoff import MEM, Pending, Signature
from gpushare.isolation.policy import WeightReading, weight_from_env
from gpushare.node.cdi import HandOff
from gpushare.node.enforcement.hook import ContainerAnswer
from gpushare.node.gpus import GpuInfo, mem_units
from gpushare.node.handout import container_answer

CLAIM_KIND = f"{DRA_DRIVER}/claim"
"""The CDI kind of the specs the driver writes: one spec per claim, one device per request."""
CDI_VERSION = "0.5.0"
"""The least CDI version with everything a claim's spec uses (env, mounts, device nodes)."""
SPEC_PREFIX = f"{DRA_DRIVER}-claim-"
"""Spec file names: ``gpushare.io-claim-<uid>.json`` in the driver's CDI directory."""


@dataclass(frozen=True)
class Refusal:
    """Why a claim cannot be prepared; kubelet shows the reason on the pod's events."""

    reason: str


@dataclass(frozen=True)
class Result:
    """One allocation result of ours: a request's share of one GPU."""

    request: str
    device: str
    index: int
    mem_units: int
    core_pct: int


@dataclass(frozen=True)
class RequestHandout:
    """What the containers of one request get: its results, signature and answer."""

    request: str
    results: tuple[Result, ...]
    signature: Signature
    answer: ContainerAnswer


def spec_file_name(claim_uid: str) -> str:
    """The claim's CDI spec file name."""
    return f"{SPEC_PREFIX}{claim_uid}.json"


def cdi_device_name(claim_uid: str, request: str) -> str:
    """The CDI device of one request in its claim's spec (letters, digits, '-', '.', '_')."""
    return f"{claim_uid}-{request}"


def check_claim(claim: KubeObject, *, namespace: str, name: str, uid: str) -> Refusal | None:
    """Why the claim read is not the one kubelet named (deleted and made again); None when it is."""
    if uid_of(claim) != uid:
        return Refusal(
            f"ResourceClaim {namespace}/{name} has UID {uid_of(claim) or '(none)'}, kubelet asked "
            f"for UID {uid}: the claim was deleted and created again; kubelet retries with the "
            f"pod's current claim"
        )
    return None


def _memory_mib(raw: Any, where: str) -> int | Refusal:
    parsed = parse_quantity(raw)
    if isinstance(parsed, str):
        return Refusal(f"{where}: {parsed}")
    mib = parsed.value / (1024 * 1024)
    if mib.denominator != 1 or mib < 0:
        return Refusal(f"{where}={raw!r} is not a whole number of MiB")
    return int(mib)


def _percent(raw: Any, where: str) -> int | Refusal:
    parsed = parse_quantity(raw)
    if isinstance(parsed, str):
        return Refusal(f"{where}: {parsed}")
    if parsed.value != Fraction(int(parsed.value)) or not 0 <= parsed.value <= 100:
        return Refusal(f"{where}={raw!r} is not a whole percent from 0 to 100")
    return int(parsed.value)


def results_of(
    claim: KubeObject, *, pool: str, unit: MemoryUnit, gpus: Sequence[GpuInfo]
) -> tuple[Result, ...] | Refusal:
    """This node's results in the claim's allocation, with the memory units and percent each
    consumes; a Refusal when the claim is not allocated or a result cannot be served."""
    where = f"ResourceClaim {namespace_of(claim)}/{name_of(claim)}"
    allocation = (claim.get("status") or {}).get("allocation")
    if not isinstance(allocation, dict):
        return Refusal(f"{where} is not allocated (status.allocation is empty)")
    by_index = {g.index: g for g in gpus}
    out: list[Result] = []
    for i, result in enumerate((allocation.get("devices") or {}).get("results") or []):
        if not isinstance(result, dict):
            continue
        if result.get("driver") != DRA_DRIVER or result.get("pool") != pool:
            continue
        field = f"{where} status.allocation.devices.results[{i}]"
        device = str(result.get("device", ""))
        index = index_of(device)
        gpu = by_index.get(index) if index is not None else None
        if gpu is None:
            known = ", ".join(f"gpu-{g.index}" for g in gpus) or "none"
            return Refusal(
                f"{field}.device={device!r} is not a GPU of node {pool} (it has {known}): the "
                f"claim was allocated from a slice that no longer matches the node; delete the "
                f"pod so its claim is allocated again"
            )
        if not gpu.healthy:
            return Refusal(
                f"{field}.device={device!r}: GPU {gpu.index} ({gpu.uuid}) is unhealthy and was "
                f"taken out of the node's ResourceSlice; delete the pod so its claim is "
                f"allocated on a healthy GPU"
            )
        consumed = result.get("consumedCapacity") or {}
        mem_raw = consumed.get(DRA_CAPACITY_MEMORY)
        if mem_raw is None:  # no consumable capacity: the whole GPU (the policy's default)
            units = mem_units(gpu, unit)
        else:
            mib = _memory_mib(mem_raw, f"{field}.consumedCapacity.{DRA_CAPACITY_MEMORY}")
            if isinstance(mib, Refusal):
                return mib
            if mib % unit.mib or mib == 0:
                return Refusal(
                    f"{field}.consumedCapacity.{DRA_CAPACITY_MEMORY}={mem_raw!r} is not a whole "
                    f"number of the node's unit {unit.value}: the slice steps memory by the unit, "
                    f"so the claim was allocated against another slice; delete the pod so its "
                    f"claim is allocated again"
                )
            units = mib // unit.mib
        cores_raw = consumed.get(DRA_CAPACITY_CORES)
        cores = 0
        if cores_raw is not None:
            pct = _percent(cores_raw, f"{field}.consumedCapacity.{DRA_CAPACITY_CORES}")
            if isinstance(pct, Refusal):
                return pct
            cores = pct
        out.append(Result(str(result.get("request", "")), device, gpu.index, units, cores))
    return tuple(out)


def signatures(results: Sequence[Result]) -> dict[str, Signature]:
    """Each request's signature, in the order the results name the requests; the claim's
    memory is the pod's (``ALIYUN_COM_GPU_MEM_POD``)."""
    claim_units = sum(r.mem_units for r in results)
    by_request: dict[str, list[Result]] = {}
    for result in results:
        by_request.setdefault(result.request, []).append(result)
    out = {}
    for request, mine in by_request.items():
        layout = tuple((r.index, r.mem_units) for r in mine)
        cores = tuple((r.index, r.core_pct) for r in mine if r.core_pct)
        out[request] = Signature(MEM, sum(m for _, m in layout), layout, claim_units, cores)
    return out


def hand_out(
    results: Sequence[Result],
    *,
    gpus: Sequence[GpuInfo],
    unit: MemoryUnit,
    mode: Mode,
    handoff: HandOff,
) -> list[RequestHandout]:
    """What each request's containers get before the isolation hook adds its part."""
    out = []
    for request, signature in signatures(results).items():
        answer = container_answer(signature, gpus, unit, mode, handoff)
        mine = tuple(r for r in results if r.request == request)
        out.append(RequestHandout(request, mine, signature, answer))
    return out


def pending(claim: KubeObject, handout: RequestHandout) -> Pending:
    """Who the isolation hook serves for a request: the claim, with the request as container
    (its accounts are kept under ``<claim uid>/<request>``)."""
    return Pending(
        uid=uid_of(claim),
        pod=f"{namespace_of(claim)}/{name_of(claim)}",
        container=handout.request,
        signature=handout.signature,
    )


def container_edits(answer: ContainerAnswer) -> dict[str, Any]:
    """The CDI ``containerEdits`` that give a container this answer's environment, mounts and
    device nodes (the CDI specification's ``specs-go`` field names)."""
    edits: dict[str, Any] = {"env": [f"{k}={v}" for k, v in sorted(answer.envs.items())]}
    if answer.mounts:
        edits["mounts"] = [
            {
                "hostPath": host,
                "containerPath": container,
                "options": ["ro" if read_only else "rw", "nosuid", "nodev", "bind"],
            }
            for container, host, read_only in answer.mounts
        ]
    if answer.devices:
        edits["deviceNodes"] = [
            {"path": container, "hostPath": host, "permissions": permissions}
            for container, host, permissions in answer.devices
        ]
    return edits


def claim_spec(claim_uid: str, answers: Mapping[str, ContainerAnswer]) -> dict[str, Any]:
    """The claim's CDI spec: one device per request, named ``<claim uid>-<request>``."""
    return {
        "cdiVersion": CDI_VERSION,
        "kind": CLAIM_KIND,
        "devices": [
            {"name": cdi_device_name(claim_uid, request), "containerEdits": container_edits(a)}
            for request, a in answers.items()
        ],
    }


@dataclass(frozen=True)
class PreparedDevice:
    """One device of kubelet's answer: the request it serves, where it is, its CDI names."""

    request: str
    pool: str
    device: str
    cdi_ids: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """The checkpoint's form."""
        return {
            "request": self.request,
            "pool": self.pool,
            "device": self.device,
            "cdi_ids": list(self.cdi_ids),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PreparedDevice:
        """Read the checkpoint's form back."""
        return cls(
            str(data["request"]),
            str(data["pool"]),
            str(data["device"]),
            tuple(str(i) for i in data.get("cdi_ids", ())),
        )


def prepared_devices(
    claim_uid: str,
    handouts: Sequence[RequestHandout],
    answers: Mapping[str, ContainerAnswer],
    *,
    pool: str,
    gpus: Sequence[GpuInfo],
) -> tuple[PreparedDevice, ...]:
    """kubelet's answer for a claim: each result's device with its CDI names.

    A GPU's own CDI device (``nvidia.com/gpu=<uuid>`` under cdi-cri) goes with that GPU's
    result; the request's device in the claim's spec and any other CDI device of the answer
    (the isolation check) go with the request's first result only, so no container gets one
    twice.
    """
    uuid_of = {g.index: g.uuid for g in gpus}
    out = []
    for handout in handouts:
        answer = answers[handout.request]
        gpu_ids = {
            r.index: tuple(i for i in answer.cdi_devices if i.endswith(f"={uuid_of[r.index]}"))
            for r in handout.results
        }
        own = {i for ids in gpu_ids.values() for i in ids}
        rest = (
            f"{CLAIM_KIND}={cdi_device_name(claim_uid, handout.request)}",
            *(i for i in answer.cdi_devices if i not in own),
        )
        for n, result in enumerate(handout.results):
            ids = (*gpu_ids[result.index], *(rest if n == 0 else ()))
            out.append(PreparedDevice(handout.request, pool, result.device, ids))
    return tuple(out)


def claim_users(claim: KubeObject) -> tuple[str, ...]:
    """The names of the pods the claim is reserved for (``status.reservedFor``), in its
    namespace."""
    reserved = (claim.get("status") or {}).get("reservedFor") or []
    return tuple(
        str(r["name"])
        for r in reserved
        if isinstance(r, dict) and r.get("resource") == "pods" and r.get("name")
    )


def request_weight(
    pod: KubeObject, claim_name: str, request: str, *, max_weight: int
) -> WeightReading:
    """The cGPU weight the pod's containers using ``request`` of the claim ask for (the lowest
    of them; 1 when none asks), with the first problem of a bad value."""
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    entries = [*(spec.get("resourceClaims") or []), *(status.get("resourceClaimStatuses") or [])]
    names = {
        e.get("name")
        for e in entries
        if isinstance(e, dict) and e.get("resourceClaimName") == claim_name
    }
    readings = []
    for c in (*(spec.get("initContainers") or []), *(spec.get("containers") or [])):
        refs = ((c.get("resources") or {}).get("claims") or []) if isinstance(c, dict) else []
        if any(r.get("name") in names and r.get("request") in (None, "", request) for r in refs):
            where = f"pod {namespace_of(pod)}/{name_of(pod)} container {c.get('name')}"
            readings.append(weight_from_env(c.get("env"), max_weight=max_weight, where=where))
    if not readings:
        return WeightReading()
    problem = next((r.problem for r in readings if r.problem), "")
    return WeightReading(min(r.weight for r in readings), problem)
