"""The hand-off from scheduler to device plugin, made provable instead of guessed.

kubelet's ``Allocate`` names only device IDs (as many as the container asks for), never the pod.
The predecessor guessed the pod (the oldest with that amount) and served the wrong one. gpushare
keeps one invariant instead, on nodes whose device plugin announces it (``gpushare.io/handoff``):

    Among the containers bound to a node but not yet served by its device plugin, two with the
    same device count for a resource always have the same *signature*: the same GPUs, the same
    amount on each, and the same pod-level values that go into the container's environment.

The extender keeps it when it places pods (it picks the GPUs that keep it, or defers the pod),
so every candidate for an ``Allocate(count)`` call wants the same answer, and the device plugin
answers correctly whichever pod kubelet is admitting. Afterwards kubelet's PodResources API tells
which pod got which device IDs, and the pod is marked served (``ALIYUN_COM_GPU_MEM_ASSIGNED``),
which lifts its constraint.

Only allocations gpushare placed take part (core.records.trust). A pod bound to the node that asks
for
these devices without one (created with ``spec.nodeName``, or carrying a forged record) is a
*stranger*: kubelet may be admitting it when an ``Allocate`` of one of its containers' counts
arrives, and answering with a waiting pod's signature would hand it that pod's GPU. Such a call
is refused instead, naming the stranger. A pod gpushare placed that kubelet admits at that same
moment is refused too (its controller creates it again); an admission rule refusing
``spec.nodeName`` on shared-GPU pods keeps strangers rare.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpushare.core.model.containers import ContainerKind
from gpushare.core.model.status import SUCCESS, Code, Status, refused
from gpushare.core.records.allocation import Allocation, ContainerShare

MEM = "mem"
CORE = "core"
SOURCE = "handoff"
"""Who the hand-off's statuses say decided."""


@dataclass(frozen=True)
class Signature:
    """What one ``Allocate`` answer for a container depends on."""

    resource: str
    count: int
    """How many devices kubelet names: memory units, or percent of computing power."""
    layout: tuple[tuple[int, int], ...]
    """(GPU index, amount) pairs: memory units, or core percent."""
    pod_mem_units: int
    core_layout: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Stranger:
    """A pod bound to the node, not started, asking for devices without a trusted allocation."""

    uid: str
    pod: str
    reason: str
    """Why gpushare does not count it as placed (no allocation, or why it was ignored)."""
    counts: frozenset[tuple[str, int]]
    """(resource, device count) its containers' ``Allocate`` calls would ask for."""


@dataclass(frozen=True)
class Pending:
    """One container waiting for the device plugin, with its signature."""

    uid: str
    pod: str
    container: str
    signature: Signature


def container_signatures(allocation: Allocation, container: ContainerShare) -> list[Signature]:
    """The signatures of one container (memory, and core when it asks for computing power)."""
    layout = tuple((s.index, s.mem_units) for s in container.gpus if s.mem_units)
    cores = tuple((s.index, s.core_pct) for s in container.gpus if s.core_pct)
    out = []
    if container.mem_units:
        out.append(Signature(MEM, container.mem_units, layout, allocation.mem_units, cores))
    if container.core_pct:
        # kubelet asks for as many devices as the limit's value: one device per percent
        out.append(Signature(CORE, container.core_pct, cores, allocation.mem_units, cores))
    return out


def listed_signatures(allocation: Allocation) -> dict[tuple[str, str], Signature]:
    """The signatures kubelet's PodResources reports for a pod, by (container, resource).

    PodResources lists a pod's restartable init containers (sidecars) and its regular
    containers, never its ordinary init containers (kubernetes/kubernetes
    pkg/kubelet/apis/podresources/server_v1.go, ``List``), so a served-check that waits for an
    ordinary init container waits forever. Those get their devices through Allocate all the
    same, and their devices are reused by the containers after them.
    """
    return {
        (c.name, s.resource): s
        for c in allocation.containers
        if c.kind is not ContainerKind.INIT
        for s in container_signatures(allocation, c)
    }


def any_pending(allocations: Iterable[Allocation]) -> bool:
    """Whether the device plugin has not served some of these allocations yet."""
    return any(not allocation.assigned for allocation in allocations)


def pending_of(allocations: Iterable[Allocation]) -> list[Pending]:
    """Containers of allocations the device plugin has not served yet."""
    out = []
    for allocation in allocations:
        if allocation.assigned:
            continue
        for container in allocation.containers:
            for signature in container_signatures(allocation, container):
                out.append(Pending(allocation.uid, allocation.key, container.name, signature))
    return out


def conflict(candidate: Allocation, pending: Iterable[Pending]) -> Status | None:
    """Why placing ``candidate`` would break the invariant; None when it keeps it.

    A pod that must wait for another to start is deferred (``Code.WAIT``); one whose own
    containers cannot be told apart is unschedulable as it is placed.
    """
    mine = [s for c in candidate.containers for s in container_signatures(candidate, c)]
    by_key = {(s.resource, s.count): s for s in mine}
    if len(by_key) != len(mine):
        seen: dict[tuple[str, int], Signature] = {}
        for s in mine:
            other = seen.setdefault((s.resource, s.count), s)
            if other != s:
                return refused(
                    Code.UNSCHEDULABLE,
                    f"two containers of the pod ask for {s.count} {s.resource} devices but get "
                    f"different GPUs; the device plugin could not tell them apart",
                    SOURCE,
                )
    for entry in pending:
        if entry.uid == candidate.uid:
            continue
        key = (entry.signature.resource, entry.signature.count)
        if key in by_key and by_key[key] != entry.signature:
            gpus = ",".join(str(i) for i, _ in entry.signature.layout)
            return refused(
                Code.WAIT,
                f"waiting for pod {entry.pod} to start: its container {entry.container} asks "
                f"for the same {entry.signature.count} {entry.signature.resource} devices on "
                f"GPU {gpus}, and the device plugin must tell the two apart",
                SOURCE,
            )
    return None


def preferred_gpus(candidate_sizes: Iterable[int], pending: Iterable[Pending]) -> tuple[int, ...]:
    """GPUs that pending containers of the same memory size already use (to reuse them)."""
    sizes = set(candidate_sizes)
    out: list[int] = []
    for entry in pending:
        if entry.signature.resource == MEM and entry.signature.count in sizes:
            out.extend(i for i, _ in entry.signature.layout if i not in out)
    return tuple(out)


@dataclass(frozen=True)
class Answer:
    """What ``Allocate`` serves for one container request, or, when ``signature`` is None,
    why it cannot (``status``)."""

    signature: Signature | None
    candidates: tuple[Pending, ...] = ()
    status: Status = SUCCESS
    """Why the call gets no answer (``Code.UNSCHEDULABLE``: it may once the pods change)."""


def _unanswered(reason: str) -> Status:
    """Why an ``Allocate`` call gets no answer: refused for now, the pods may change."""
    return refused(Code.UNSCHEDULABLE, reason, SOURCE)


def resolve(
    resource: str, count: int, pending: Iterable[Pending], strangers: Iterable[Stranger] = ()
) -> Answer:
    """The answer for ``Allocate(count)`` of a resource on a node, from its pending containers.

    Under the invariant all candidates share one signature. If they do not (annotations edited
    by hand) the call fails with the reason rather than guessing; so does a call that a
    stranger of that count may be making (see the module docstring).
    """
    matches = tuple(
        p for p in pending if p.signature.resource == resource and p.signature.count == count
    )
    suspects = sorted((s for s in strangers if (resource, count) in s.counts), key=lambda s: s.pod)
    if suspects:
        named = "; ".join(f"pod {s.pod} ({s.reason})" for s in suspects)
        if not matches:
            return Answer(
                None,
                status=_unanswered(
                    f"{named} asks for {count} {resource} device(s) but was not placed by "
                    f"gpushare, which serves only the pods it placed: delete it and create it "
                    f"without spec.nodeName, so that gpushare's scheduler places it"
                ),
            )
        waiting = ", ".join(sorted({m.pod for m in matches}))
        return Answer(
            None,
            matches,
            status=_unanswered(
                f"{named} is bound to this node and asks for {count} {resource} device(s) "
                f"without being placed by gpushare; kubelet may be admitting it rather than "
                f"{waiting}, which gpushare placed, so this container gets no answer (once "
                f"kubelet has rejected that pod, the pod gpushare placed gets its own): delete "
                f"the pod gpushare did not place"
            ),
        )
    if not matches:
        return Answer(
            None,
            status=_unanswered(
                f"no pod bound to this node is waiting for {count} {resource} device(s); "
                f"the pod being admitted was not placed by gpushare, or its annotations are "
                f"missing"
            ),
        )
    signatures = {m.signature for m in matches}
    if len(signatures) > 1:
        pods = ", ".join(sorted({m.pod for m in matches}))
        return Answer(
            None,
            matches,
            status=_unanswered(
                f"pods {pods} wait for {count} {resource} device(s) on different GPUs; refusing to "
                f"guess which one kubelet is admitting"
            ),
        )
    return Answer(matches[0].signature, matches)
