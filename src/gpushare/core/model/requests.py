"""What a pod asks for, read from container ``limits`` and checked against every rule.

Invalid requests are outcomes, not exceptions: ``read_pod`` returns a ``Rejection`` whose reasons
each name the container, the field, the value and the rule, and say what to write instead. The
webhook, the extender's filter and the demo all print these same sentences.

Kubernetes counts init containers by taking, per resource, the larger of the app containers'
sum and each init container's own request (sidecars, init containers with ``restartPolicy:
Always``, add to everything started after them). The pod's effective amount is what it holds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from functools import cache, cached_property
from typing import Any

from gpushare.core.model.containers import ContainerKind, counted
from gpushare.core.model.gpumodel import pod_models
from gpushare.core.model.hostresources import NOTHING, HostResources, pod_requests
from gpushare.core.model.inventory import CORE_PER_GPU
from gpushare.core.model.kubejson import (
    KubeObject,
    labels_of,
    name_of,
    namespace_of,
    pod_spec_of,
    uid_of,
    whole_number,
)
from gpushare.core.model.names import DEFAULT_NAMES, LABEL_POD_GPU_COUNT, ResourceNames
from gpushare.core.model.quantity import Quantity, parse_quantity
from gpushare.core.model.spreading import spread
from gpushare.core.model.units import MAX_GPU_MEMORY, MemoryUnit

CORE_STEP = 5
CORE_MIN = CORE_STEP  # the smallest share is one step


@dataclass(frozen=True)
class ContainerRequest:
    """One container's GPU request; containers without one are not listed."""

    name: str
    kind: ContainerKind
    mem_units: int
    core_pct: int = 0


@dataclass(frozen=True)
class PodRequest:
    """A valid pod request; ``mem_units == 0`` means the pod wants no shared GPU."""

    namespace: str
    name: str
    uid: str
    containers: tuple[ContainerRequest, ...]
    gpu_count: int
    mem_units: int
    """Effective memory of the whole pod, as Kubernetes counts init containers."""
    core_pct: int = 0
    """Effective computing power of the whole pod, in percent of one GPU."""
    host: HostResources = NOTHING
    """CPU and host memory the pod requests of its node (``core.model.hostresources``)."""
    models: tuple[str, ...] = ()
    """GPU models the pod accepts through the model label (``core.model.gpumodel``); empty: any."""

    @property
    def wants_gpu(self) -> bool:
        """Whether the pod asks for shared GPU memory at all."""
        return self.mem_units > 0

    @property
    def wants_core(self) -> bool:
        """Whether the pod asks for computing power (it then needs a core_mem node)."""
        return self.core_pct > 0

    @cached_property
    def mem_layouts(self) -> tuple[tuple[int, ...], ...]:
        """Each container's memory units on each of the pod's GPUs, by position."""
        return self._layouts([c.mem_units for c in self.containers])

    @cached_property
    def core_layouts(self) -> tuple[tuple[int, ...], ...]:
        """Each container's percent of computing power on each of the pod's GPUs, by position."""
        return self._layouts([c.core_pct for c in self.containers])

    @cached_property
    def mem_holding(self) -> tuple[int, ...]:
        """Memory units the pod holds on each of its GPUs, by position."""
        return self._holding(self.mem_layouts)

    @cached_property
    def core_holding(self) -> tuple[int, ...]:
        """Percent the pod holds on each of its GPUs, by position."""
        return self._holding(self.core_layouts)

    @property
    def mem_per_gpu(self) -> int:
        """Units the pod needs free on each of its GPUs: its largest holding on one of them.

        That is the even share ``mem_units / gpu_count`` unless equal containers cannot split
        evenly (core.model.spreading); a GPU chosen for a smaller share then keeps the difference.
        """
        return max(self.mem_holding)

    @property
    def core_per_gpu(self) -> int:
        """Percent the pod needs free on each of its GPUs: its largest holding on one of them."""
        return max(self.core_holding)

    def _layouts(self, amounts: list[int]) -> tuple[tuple[int, ...], ...]:
        running = [c.kind is not ContainerKind.INIT for c in self.containers]
        return tuple(spread(amounts, running, self.gpu_count))

    def _holding(self, layouts: tuple[tuple[int, ...], ...]) -> tuple[int, ...]:
        kinds = [c.kind for c in self.containers]
        return tuple(
            counted(zip(kinds, (layout[p] for layout in layouts), strict=True))
            for p in range(self.gpu_count)
        )

    @property
    def key(self) -> str:
        """``namespace/name`` for messages."""
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Rejection:
    """Why a pod's GPU request is invalid; each reason is a complete sentence."""

    namespace: str
    name: str
    reasons: tuple[str, ...]

    @property
    def message(self) -> str:
        """All reasons in one line, for events and HTTP replies."""
        return "; ".join(self.reasons)


@dataclass(frozen=True)
class _Count:
    """How one resource is counted, for its messages and its ceiling."""

    what: str
    """The resource as messages name it."""
    units: str
    """What it counts: ``units of 1GiB``, ``percent``."""
    counts: str
    """What one unit is, and how to write an amount: ``units of 1GiB, not bytes: ...``."""
    example: str
    ceiling: int = 0
    """The most a container may ask for (0: no ceiling here; later rules bound it)."""
    ceiling_why: str = ""


@cache  # a few settings a process; read for every container with GPU memory
def _mem_count(names: ResourceNames, unit: MemoryUnit) -> _Count:
    return _Count(
        what=names.mem,
        units=f"units of {unit.value}",
        counts=f"units of {unit.value}, not bytes: for 3 GiB write {3 * 1024 // unit.mib}",
        example="3",
        ceiling=unit.max_units,
        ceiling_why=f"at most {unit.max_units} units of {unit.value}, {MAX_GPU_MEMORY}",
    )


@cache
def _core_count(names: ResourceNames) -> _Count:
    return _Count(
        what=names.core,
        units="percent",
        counts="percent of one GPU, not bytes: write 30 for 30%",
        example="30",
    )


def _parse_count(raw: Any, *, where: str, field: str, count: _Count) -> tuple[int | None, str]:
    """Read a whole-number resource value; return (value, "") or (None, reason).

    Accepted is every spelling Kubernetes counts as the same whole number: ``3``, ``"+3"``,
    ``"3."``, ``"3e0"``, ``"0.3e1"``, ``"3000m"`` (``core.model.quantity``), and decimal
    multipliers:
    kube-apiserver stores ``1000`` as ``"1k"`` (Quantity's canonical form), so ``"1k"`` is 1000
    wherever it came from. Refused, each with its own sentence: zero, negative and fractional
    values, a power-of-1024 suffix (``Ki``, ``Gi``, ...: how sizes in bytes are written, never
    how kube-apiserver rewrites a count), and more memory than any GPU has (a size in bytes,
    bare or as ``3G``).
    """
    shown = f"{where}: {field}={raw!r}"
    parsed = parse_quantity(raw)
    if isinstance(parsed, str):
        if parsed == "is not a number":
            return None, f"{shown} is not a number; write a plain integer such as {count.example}"
        return None, (
            f"{shown} is not a whole number Kubernetes can read ({parsed}); write a plain "
            f"integer such as {count.example}"
        )
    value = parsed.value
    if value < 0:
        return None, f"{shown} is negative; write an integer >= 1"
    if value == 0:
        return None, f"{shown} asks for nothing; write an integer >= 1 or remove the resource"
    if parsed.binary:
        return None, (
            f"{shown} has a unit suffix ({parsed.suffix}, {parsed.factor}), the notation of "
            f"sizes in bytes; {count.what} counts {count.counts}"
        )
    if value.denominator != 1:
        return None, (
            f"{shown} is fractional ({float(value):g}); {count.what} counts whole "
            f"{count.units}: write an integer >= 1"
        )
    if count.ceiling and value > count.ceiling:
        return None, (
            f"{shown} is more than any GPU has ({count.ceiling_why}); {count.what} counts "
            f"{count.counts}"
        )
    return int(value), ""


def _same_amount(a: Any, b: Any) -> bool:
    """Whether two resource values are equal as Kubernetes compares them (``"+3"`` is 3)."""
    left, right = parse_quantity(a), parse_quantity(b)
    if isinstance(left, Quantity) and isinstance(right, Quantity):
        return left.value == right.value
    return str(a) == str(b)


def _resources(container: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    resources = container.get("resources") or {}
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    return limits, requests


def _read_container(
    container: Mapping[str, Any],
    kind: ContainerKind,
    where: str,
    names: ResourceNames,
    unit: MemoryUnit,
    reasons: list[str],
) -> ContainerRequest | None:
    limits, requests = _resources(container)
    mem = core = 0
    for resource in (names.mem, names.core):
        if resource in requests and resource not in limits:
            reasons.append(
                f'{where}: requests["{resource}"]={requests[resource]!r} is set without '
                f'limits["{resource}"]; extended resources are asked for under limits: '
                f"move it there"
            )
        elif resource in requests and not _same_amount(requests[resource], limits[resource]):
            reasons.append(
                f'{where}: requests["{resource}"]={requests[resource]!r} differs from '
                f'limits["{resource}"]={limits[resource]!r}; extended resources need requests '
                f"equal to limits: set only limits"
            )
    if names.mem in limits:
        value, reason = _parse_count(
            limits[names.mem],
            where=where,
            field=f'limits["{names.mem}"]',
            count=_mem_count(names, unit),
        )
        if reason:
            reasons.append(reason)
        else:
            mem = value or 0
    if names.core in limits:
        value, reason = _parse_count(
            limits[names.core],
            where=where,
            field=f'limits["{names.core}"]',
            count=_core_count(names),
        )
        if reason:
            reasons.append(reason)
        elif value is not None and value % CORE_STEP:
            reasons.append(
                f'{where}: limits["{names.core}"]={limits[names.core]!r} is not a multiple of '
                f"{CORE_STEP}; computing power is shared in steps of {CORE_STEP}: "
                f"use {CORE_STEP}, {2 * CORE_STEP}, ... {CORE_PER_GPU}"
            )
        else:
            core = value or 0
        if names.mem not in limits:
            reasons.append(
                f'{where}: limits["{names.core}"]={limits[names.core]!r} is set without '
                f'limits["{names.mem}"]; computing power is shared only with GPU memory: '
                f"add {names.mem}"
            )
    if mem == 0 and core == 0:
        return None
    name = str(container.get("name") or "")
    return ContainerRequest(name=name, kind=kind, mem_units=mem, core_pct=core)


def effective_amount(containers: Sequence[ContainerRequest], amount: str) -> int:
    """The pod-level amount as Kubernetes counts it (init, sidecar and app containers)."""
    return counted((c.kind, int(getattr(c, amount))) for c in containers)


def _read_gpu_count(pod: KubeObject, reasons: list[str]) -> int:
    raw = labels_of(pod).get(LABEL_POD_GPU_COUNT)
    if raw is None:
        return 1
    count = whole_number(raw)
    if count is None or count < 1:
        reasons.append(
            f"pod label {LABEL_POD_GPU_COUNT}={raw!r} must be a whole number >= 1 "
            f"(the number of GPUs to spread the pod's memory over); fix or remove the label"
        )
        return 1
    return count


def read_pod(
    pod: KubeObject,
    *,
    names: ResourceNames = DEFAULT_NAMES,
    unit: MemoryUnit = MemoryUnit.GiB,
    spec_path: str = "spec",
) -> PodRequest | Rejection:
    """Read and validate a pod's GPU request from its spec and labels.

    ``spec_path`` is where the pod spec sits in the object the user wrote (for a Job's pod
    template ``spec.template.spec``), so each reason points at the line to change.
    """
    spec = pod_spec_of(pod)
    reasons: list[str] = []
    containers: list[ContainerRequest] = []
    for position, container in enumerate(spec.get("initContainers") or []):
        kind = (
            ContainerKind.SIDECAR
            if container.get("restartPolicy") == "Always"
            else ContainerKind.INIT
        )
        where = f'container "{container.get("name", "")}" ({spec_path}.initContainers[{position}])'
        read = _read_container(container, kind, where, names, unit, reasons)
        if read:
            containers.append(read)
    for position, container in enumerate(spec.get("containers") or []):
        where = f'container "{container.get("name", "")}" ({spec_path}.containers[{position}])'
        read = _read_container(container, ContainerKind.APP, where, names, unit, reasons)
        if read:
            containers.append(read)
    gpu_count = _read_gpu_count(pod, reasons)
    mem = effective_amount(containers, "mem_units")
    core = effective_amount(containers, "core_pct")
    label = f"{LABEL_POD_GPU_COUNT}={gpu_count}"
    if not reasons:
        if LABEL_POD_GPU_COUNT in labels_of(pod) and mem == 0:
            reasons.append(
                f"pod label {label} is set but no container asks for {names.mem}; "
                f"add {names.mem} limits or remove the label"
            )
        if mem % gpu_count:
            reasons.append(
                f"pod memory {unit.describe(mem)} does not divide evenly over label {label}; "
                f"ask for a multiple of {gpu_count} units in total"
            )
        if core:
            per_gpu, rest = divmod(core, gpu_count)
            if rest or per_gpu % CORE_STEP or not CORE_MIN <= per_gpu <= CORE_PER_GPU:
                share = Decimal(core) / gpu_count  # exact: a float cannot hold every count
                reasons.append(
                    f"pod computing power {names.core}={core} over {gpu_count} GPU(s) is "
                    f"{share:.6g}% per GPU; each GPU gives a multiple of {CORE_STEP} "
                    f"from {CORE_MIN} to {CORE_PER_GPU}: lower the request or raise {label}"
                )
    if reasons:
        return Rejection(namespace=namespace_of(pod), name=name_of(pod), reasons=tuple(reasons))
    return PodRequest(
        namespace=namespace_of(pod),
        name=name_of(pod),
        uid=uid_of(pod),
        containers=tuple(containers),
        gpu_count=gpu_count,
        mem_units=mem,
        core_pct=core,
        host=pod_requests(pod),
        models=pod_models(pod),
    )


READINGS_KEPT = 2048
"""Readings ``Readings`` keeps before it starts over: more than the pods in flight between
the watch, a filter and a bind."""

Reading = PodRequest | Rejection


def _version_key(pod: KubeObject) -> tuple[str, str] | None:
    """(UID, resourceVersion) of a stored pod; None for one without either."""
    metadata = pod.get("metadata")
    if not isinstance(metadata, dict):
        return None
    uid, version = metadata.get("uid"), metadata.get("resourceVersion")
    if not (uid and version and isinstance(uid, str) and isinstance(version, str)):
        return None
    return uid, version


class Readings:
    """Pod requests read once per stored version of each pod.

    One pod is read several times on its way: the watch shows it and the workload counts it,
    kube-scheduler's filter hands it over, bind starts from the watch's copy. All of them
    carry the same resourceVersion, and the API server gives every change a new one, so
    one reading serves all. A pod without UID or version is read each time.

    What fills one ``Readings`` must be a pod as the API server stored it (the watch, a list,
    bind's own read): a body sent to the extender names the UID and version it likes, so it
    is read into a ``Readings`` of its own (``Scheduler``), never into the one bind reads.
    """

    def __init__(
        self,
        *,
        names: ResourceNames = DEFAULT_NAMES,
        unit: MemoryUnit = MemoryUnit.GiB,
        kept: int = READINGS_KEPT,
    ) -> None:
        self.names = names
        self.unit = unit
        self.kept = kept
        self._read: dict[tuple[str, str], Reading] = {}

    def read(self, pod: KubeObject) -> Reading:
        """The pod's request, read now or the reading of its version kept from before."""
        key = _version_key(pod)
        if key is None:
            return read_pod(pod, names=self.names, unit=self.unit)
        known = self._read.get(key)
        if known is None:
            if len(self._read) >= self.kept:
                self._read.clear()
            known = self._read[key] = read_pod(pod, names=self.names, unit=self.unit)
        return known

    def get(self, pod: KubeObject) -> Reading | None:
        """The reading kept for the pod's version; None when there is none."""
        key = _version_key(pod)
        return self._read.get(key) if key is not None else None
