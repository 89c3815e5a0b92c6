"""When an intent gives way: GPUs booked for pods that do not bind cannot be held from others.

An intent (``core.booking.ledger``) books the top node's GPUs for a pod between kube-scheduler's
choice and its bind, so that the pods filtered meanwhile do not take the same share and fail
their binds. kube-scheduler binds within milliseconds of choosing unless the pod waits in PreBind
or Permit, and a pod can be made to wait there for ever: a claim of a ``WaitForFirstConsumer``
StorageClass whose volume is never provisioned keeps it in VolumeBinding's PreBind for 10
minutes. Issue 56's attack deleted such pods and created them again every 25 s (or in a new
namespace each time): every new pod is new to every rule that remembers pods or namespaces
(the namespace rule in ``extender.intents``), so each booked again, and the attacker held half
the pool for 130 s of 130 while 3 or 4 of 8 victims never bound.

So what gives an intent its hold is not who its pod is but two things a tenant cannot reset by
creating pods again:

- **Time.** An intent holds against every pod for :data:`HOLD_S` after it is booked, far more
  than a bind takes when nothing waits. After that its pod is waiting past PreBind or Permit,
  and the intent only *prefers*: a pod that fits nowhere while it stands is placed as if it
  did not (the filter gives it back, and tries again). Nothing is lost by that: the pod's bind,
  if it ever comes, checks the node again, and a bind that no longer fits is tried again by
  kube-scheduler.
- **Age.** Before that, it gives way to a pod that was there first: one of higher priority
  (``spec.priority``), or of equal priority created earlier (``metadata.creationTimestamp``),
  the order kube-scheduler's own queue keeps. A pod deleted and created again is the newest pod
  there is, so re-creating never wins a share from a pod that was already waiting; between the
  pods of one burst, the first keeps its share as before.

An intent given way is given back only if the pod then fits; otherwise it is booked again as it
was (the yield changed nothing). A pod whose intent was given way after ``HOLD_S`` counts as
stuck (``extender.intents``), as one whose intent ran out.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from gpushare.core.booking.ledger import Ledger
from gpushare.core.model.hostresources import HostResources
from gpushare.core.model.kubejson import KubeObject, meta, pod_spec_of
from gpushare.core.records.allocation import Allocation

HOLD_S = 5.0
"""How long an intent holds against every pod: kube-scheduler binds within milliseconds of its
choice when no plugin makes the pod wait, and within a second or two on a loaded machine."""


@dataclass(frozen=True)
class Yielded:
    """The intents given way to a pod, with what it takes to book them again."""

    overdue: tuple[str, ...]
    """Pods whose intent was older than ``HOLD_S``: waiting past PreBind or Permit."""
    outranked: tuple[str, ...]
    """Pods whose fresh intent gave way to a pod that was there first."""
    booked: tuple[tuple[Allocation, HostResources, int, int | None], ...]
    """Each intent as it was: (allocation, host, deadline, booked at)."""
    uids: tuple[str, ...] = field(init=False)
    """Every pod given way: ``overdue``, then ``outranked`` (in the value, so the adapter
    counts them without a call back into the core)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "uids", self.overdue + self.outranked)

    def restore(self, ledger: Ledger) -> None:
        """Book the intents again as they were (the pod did not fit all the same)."""
        for allocation, host, until, booked in self.booked:
            ledger.intend(allocation, host, until_ns=until, booked_ns=booked)


NONE = Yielded((), (), ())


def rank(pod: KubeObject) -> tuple[int, str]:
    """(priority, creation time): a higher priority, then an earlier creation, goes first."""
    priority = pod_spec_of(pod).get("priority")
    created = meta(pod).get("creationTimestamp")
    return (
        priority if isinstance(priority, int) else 0,
        created if isinstance(created, str) else "",
    )


def outranks(pod: KubeObject, holder: KubeObject) -> bool:
    """Whether ``pod`` was there first: higher priority, or equal and created earlier (both
    creation times known; RFC 3339 in UTC, as the API server writes them, sort as text)."""
    (mine, born), (theirs, holder_born) = rank(pod), rank(holder)
    if mine != theirs:
        return mine > theirs
    return bool(born and holder_born) and born < holder_born


def give_way(
    pod: KubeObject,
    uid: str,
    ledger: Ledger,
    pending: Mapping[str, KubeObject],
    *,
    nodes: Collection[str],
    now_ns: int,
    hold_ns: int,
) -> Yielded:
    """Give back the intents on ``nodes`` (those the filter asks about) that give way to
    ``pod`` (module docstring); what was given."""
    overdue: list[str] = []
    outranked: list[str] = []
    booked: list[tuple[Allocation, HostResources, int, int | None]] = []
    for allocation, until in list(ledger.intents()):
        holder = allocation.uid
        if holder == uid or allocation.node not in nodes:
            continue
        at = ledger.intent_booked(holder)
        if at is not None and now_ns - at >= hold_ns:
            overdue.append(holder)
        elif (other := pending.get(holder)) is not None and outranks(pod, other):
            outranked.append(holder)
        else:
            continue
        booked.append((allocation, ledger.host_of(holder), until, at))
        ledger.unassume(holder)
    if not booked:
        return NONE
    return Yielded(tuple(overdue), tuple(outranked), tuple(booked))
