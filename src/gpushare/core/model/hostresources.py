"""CPU and host memory: what a pod requests of a node and what a node offers.

The fragmentation-aware policy counts GPU share that CPU can no longer reach (an idle GPU on a
node whose cores are all requested is as lost as a full one), so the extender must know each
node's allocatable CPU and memory and the requests of every pod bound there, GPU or not.
kube-scheduler's NodeResourcesFit still filters on them; these numbers only feed the policy.

A pod's request is counted as kube-scheduler counts it (``resource.PodRequests`` in
k8s.io/component-helpers/resource/helpers.go): app containers and restartable init containers
(sidecars) add up, each ordinary init container needs its own amount beside the sidecars
started before it, the pod needs the larger of the two; pod-level requests
(``spec.resources.requests``, for cpu and memory) replace that sum where set; plus
``spec.overhead``. (A resize in progress, which kube-scheduler reads from the pod's status,
is not followed: the spec's amounts count.) A container
with a limit and no request requests its limit (the API server's defaulting,
pkg/apis/core/v1/defaults.go, so raw manifests count as the stored pods do). An unreadable
amount counts as nothing: the pod's real admission is the API server's, and the policy only
loses some precision on a pod the API server would refuse anyway. An amount beyond what
kube-scheduler counts in (an ``int64`` of milli-CPU or bytes: ``Resource`` in
pkg/scheduler/framework/types.go) counts as that most, so no sum or weighing of amounts that
a hostile manifest writes (``1.7e308`` CPUs) overflows the floats the policy weighs them in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from gpushare.core.model.containers import ContainerKind, counted
from gpushare.core.model.kubejson import KubeObject, node_status_of, pod_spec_of
from gpushare.core.model.quantity import Quantity, parse_quantity

MOST = 2**63 - 1
"""The largest amount counted (milli-CPU or bytes): kube-scheduler's ``int64``."""


@dataclass(frozen=True, slots=True)
class HostResources:
    """Milli-CPU and bytes of host memory."""

    cpu_milli: int = 0
    memory_bytes: int = 0

    def __add__(self, other: HostResources) -> HostResources:
        return HostResources(
            self.cpu_milli + other.cpu_milli, self.memory_bytes + other.memory_bytes
        )

    def __sub__(self, other: HostResources) -> HostResources:
        return HostResources(
            self.cpu_milli - other.cpu_milli, self.memory_bytes - other.memory_bytes
        )


NOTHING = HostResources()


def _amount(values: Mapping[str, Any], name: str, scale: int) -> int:
    """One resource in milli-CPU (scale 1000) or bytes (scale 1), rounded up; 0 if unreadable."""
    raw = values.get(name)
    if raw is None:
        return 0
    if isinstance(raw, str):
        return _scaled(raw, scale)
    return _scale(parse_quantity(raw), scale)


def _scale(parsed: Quantity | str, scale: int) -> int:
    if not isinstance(parsed, Quantity) or parsed.value < 0:
        return 0
    return min(math.ceil(parsed.value * scale), MOST)


@lru_cache(maxsize=1024)
def _scaled(raw: str, scale: int) -> int:
    """``_amount`` of a quantity string, kept: a cluster writes few distinct ones, and the
    exact arithmetic is most of the cost of counting a pod's CPU and memory."""
    return _scale(parse_quantity(raw), scale)


def _container_amount(container: Any, name: str, scale: int) -> int:
    """One container's request of a resource (its limit where it requests none)."""
    resources = (container or {}).get("resources") or {}
    requests = resources.get("requests") or {}
    return _amount(requests if name in requests else resources.get("limits") or {}, name, scale)


def pod_amount(pod: KubeObject, name: str, scale: int) -> int:
    """The pod's amount of one resource, scaled and rounded up, as kube-scheduler counts it.

    ``scale`` is 1000 for milli-CPU and 1 for bytes or devices; the simulator reads manifests
    through this too (``sim.kubeyaml``), so both count a pod alike.
    """
    spec = pod_spec_of(pod)
    kinds: list[tuple[ContainerKind, int]] = []
    for container in spec.get("initContainers") or []:
        sidecar = (container or {}).get("restartPolicy") == "Always"
        kind = ContainerKind.SIDECAR if sidecar else ContainerKind.INIT
        kinds.append((kind, _container_amount(container, name, scale)))
    for container in spec.get("containers") or []:
        kinds.append((ContainerKind.APP, _container_amount(container, name, scale)))
    pod_level = (spec.get("resources") or {}).get("requests") or {}
    base = _amount(pod_level, name, scale) if name in pod_level else counted(kinds)
    return base + _amount(spec.get("overhead") or {}, name, scale)


def pod_requests(pod: KubeObject) -> HostResources:
    """What the pod requests of its node's CPU and memory, as kube-scheduler counts it."""
    return HostResources(pod_amount(pod, "cpu", 1000), pod_amount(pod, "memory", 1))


def node_allocatable(node: KubeObject) -> HostResources:
    """The node's allocatable CPU and memory (nothing when it does not say)."""
    allocatable = node_status_of(node).get("allocatable") or {}
    if not isinstance(allocatable, Mapping):
        return NOTHING
    return HostResources(_amount(allocatable, "cpu", 1000), _amount(allocatable, "memory", 1))
