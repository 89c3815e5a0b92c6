"""cGPU computing-power policies: how the containers of one ``cgpu`` GPU share its time.

ACK's ack-ai-installer takes a cGPU ``policy`` number; gpushare's chart passes it to the device
plugin (``--cgpu-policy``, ``GPUSHARE_ISOLATION_POLICY``), which turns it, for each GPU, into a
schedule of time slices that the interposer holds every launch of a container to:

- 0 ``even``: every container gets ``1 / max pods per GPU`` of each period, used or not.
- 1 ``preemptive``: the period is split evenly among the containers active on the GPU.
- 2 ``weighted``: as 1, in proportion to each container's ``ALIYUN_COM_GPU_SCHD_WEIGHT``.
- 3 ``fixed``: every container gets its own computing-power share, used or not.
- 4 ``soft``: every active container gets the even share of 0, and the rest of the period is
  an open window that any active container may use (idle time beyond its share).
- 5 ``native``: no schedule; the GPU's own scheduling (the default).

This module is pure: it validates the number and computes a schedule from the members of one
GPU; the device plugin writes what :meth:`Schedule.render` returns, atomically, into a host
directory mounted read-only into the containers (``gpushare.node.enforcement``), and the
interposer (``native/interposer.c``, ``gs_sched_*``) reads it. The file is the containers' shared
view of each other: they can read it and cannot write it.

Two inputs come from outside the plugin's own allocation, and each from a place the tenant's
process cannot write:

- the weight of policy 2, ``ALIYUN_COM_GPU_SCHD_WEIGHT``, read from the container's ``env`` in
  the pod *object* (:func:`weight_from_env`), which the API server holds, admission checks and an
  admin can read; the same variable in the running process's environment is ignored, since any
  process can change its own;
- activity for policies 1, 2 and 4: each process's interposer reports ``active <device>`` on its
  own broker connection while it launches (``gpushare.isolation.accounting``), so a container can
  report only for itself, and a container that has not reported for :data:`IDLE_AFTER_S` leaves
  the schedule until it launches again.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import IntEnum

from gpushare.core.model.inventory import CORE_PER_GPU
from gpushare.core.model.kubejson import whole_number

SCHEDULE_VERSION = 1
DEFAULT_PERIOD_NS = 100_000_000
"""One round of time slices: 100 ms (a 5 % share is a 5 ms slice)."""
MAX_WEIGHT = 100
"""The limits file's bound; a pod's weight is held to the node's most pods per GPU (below)."""
IDLE_AFTER_S = 0.5
"""A container that has not reported activity on a GPU for this long is idle there (policies 1,
2 and 4): ten of the interposer's reports, which it sends every 50 ms while it launches."""
MAX_PODS_PER_GPU = 64
"""The chart's bound on ``maxPodsPerGpu``."""
POLICY_ENV = "GPUSHARE_ISOLATION_POLICY"
WEIGHT_ENV = "ALIYUN_COM_GPU_SCHD_WEIGHT"


class Policy(IntEnum):
    """ACK's cGPU policy numbers."""

    EVEN = 0
    PREEMPTIVE = 1
    WEIGHTED = 2
    FIXED = 3
    SOFT = 4
    NATIVE = 5


class PolicyError(ValueError):
    """A policy number or weight is not valid; the message names the field, value and rule."""


def parse_policy(value: object, field: str = "policy") -> Policy:
    """The policy for ``value`` (an int or its decimal text); PolicyError says what is wrong."""
    number = whole_number(str(value))
    if isinstance(value, bool) or number is None or number not in range(6):
        raise PolicyError(
            f"{field}={value!r} is not a cGPU policy: use 0 (even share), 1 (preemptive), "
            f"2 (weighted preemptive), 3 (fixed share), 4 (soft) or 5 (native, the default)"
        )
    return Policy(number)


def parse_weight(value: object, field: str = WEIGHT_ENV, *, max_weight: int = MAX_WEIGHT) -> int:
    """A scheduling weight, 1..max_weight; PolicyError says what is wrong."""
    number = whole_number(str(value))
    if isinstance(value, bool) or number is None or not 1 <= number <= max_weight:
        raise PolicyError(
            f"{field}={value!r} is not a scheduling weight: use a whole number from 1 to "
            f"{max_weight} (policy 2 shares a GPU's time in proportion to it)"
        )
    return number


def parse_max_pods(value: object, field: str = "--max-pods-per-gpu") -> int:
    """The most pods one GPU may hold (policy 0's share is one over it), 1..64."""
    number = whole_number(str(value))
    if isinstance(value, bool) or number is None or not 1 <= number <= MAX_PODS_PER_GPU:
        raise PolicyError(
            f"{field}={value!r} is not a pod count per GPU: use a whole number from 1 to "
            f"{MAX_PODS_PER_GPU} (the chart's maxPodsPerGpu; unset: 20, or 16 at 128MiB)"
        )
    return number


@dataclass(frozen=True)
class WeightReading:
    """A container's policy-2 weight as its pod spec gives it, and why a value was not used."""

    weight: int = 1
    problem: str = ""
    """Empty when the spec's value was used or there was none; otherwise field, value, rule."""


def weight_from_env(env: object, *, max_weight: int, where: str) -> WeightReading:
    """The weight in a container spec's ``env`` list (the API object), default 1.

    ACK applies weighted preemption when the variable is above 1, so 1 is both the default and
    the floor; the ceiling is the most pods a GPU may hold (cGPU's ``max_inst``): a weight counts
    time slices of ``1 / max pods``. Only a literal ``value`` is read: ``valueFrom`` points at a
    ConfigMap, Secret or field the tenant may change after admission. Later entries of the same
    name win, as they do in the container.
    """
    entries = [e for e in env if isinstance(e, dict)] if isinstance(env, list) else []
    named = [e for e in entries if e.get("name") == WEIGHT_ENV]
    if not named:
        return WeightReading()
    entry = named[-1]
    field = f"{where} env {WEIGHT_ENV}"
    if "value" not in entry:
        return WeightReading(
            1,
            f"{field} is set through valueFrom, which the tenant may change after admission: "
            f"give a literal value from 1 to {max_weight}; weight 1 is used",
        )
    text = entry.get("value")
    try:
        weight = parse_weight(text, field, max_weight=max_weight)
    except PolicyError as err:
        return WeightReading(1, f"{err}; weight 1 is used")
    return WeightReading(weight)


def slot_id(key: str) -> str:
    """A container's name in schedules: short, printable, the same for the same account key."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Member:
    """One container on one GPU, as the schedule sees it."""

    slot: str
    share_pct: float
    """Its own computing-power share (policy 3), 0 < share <= 100."""
    weight: int = 1
    active: bool = True
    """Launching now; policies 1, 2 and 4 give time to active members only."""


@dataclass(frozen=True)
class Slot:
    """A stretch of each period that one container (or, for ``open``, every member) may use."""

    owner: str
    start_ns: int
    length_ns: int


OPEN = "*"
"""The owner of policy 4's open window: any member of the schedule may launch in it."""


@dataclass(frozen=True)
class Schedule:
    """One GPU's time slices for one policy."""

    policy: Policy
    period_ns: int
    epoch_ns: int
    slots: tuple[Slot, ...]
    members: tuple[Member, ...] = ()
    """Who the slots were computed from: each member's weight and activity, for people."""

    def share_of(self, slot: str) -> float:
        """The fraction of each period ``slot`` owns outright (the open window not counted)."""
        return sum(s.length_ns for s in self.slots if s.owner == slot) / self.period_ns

    def render(self) -> str:
        """The schedule file's text, as the interposer reads it."""
        lines = [
            "# gpushare: computing-power time slices of one GPU, written by the device plugin",
            "# and read by libgpushare-cuda.so; offsets are CLOCK_MONOTONIC ns from epoch_ns.",
            f"version={SCHEDULE_VERSION}",
            f"policy={int(self.policy)}",
            f"period_ns={self.period_ns}",
            f"epoch_ns={self.epoch_ns}",
        ]
        lines += [f"slot={s.owner},{s.start_ns},{s.length_ns}" for s in self.slots]
        lines += [f"member={m.slot},{m.weight},{int(m.active)}" for m in self.members]
        return "\n".join(lines) + "\n"


def shares(policy: Policy, members: list[Member], max_pods: int) -> dict[str, float]:
    """Each member's owned fraction of the period (before it is laid out in slots)."""
    if max_pods < 1:
        raise PolicyError(f"max_pods={max_pods} must be at least 1")
    active = [m for m in members if m.active]
    if policy is Policy.EVEN:
        return {m.slot: 1 / max_pods for m in members}
    if policy is Policy.FIXED:
        return {
            m.slot: min(max(m.share_pct, 0.0), float(CORE_PER_GPU)) / CORE_PER_GPU for m in members
        }
    if policy is Policy.PREEMPTIVE:
        return {m.slot: 1 / len(active) for m in active}
    if policy is Policy.WEIGHTED:
        total = sum(m.weight for m in active)
        return {m.slot: m.weight / total for m in active}
    if policy is Policy.SOFT:
        return {m.slot: 1 / max_pods for m in active}
    return {}


def own_share_pct(policy: Policy, *, max_pods: int, weight: int = 1, fixed_pct: int = 0) -> int:
    """The percent of a GPU a container is sure of under ``policy``, however full the GPU.

    The interposer keeps the container to it while it cannot use its schedule (the limits file's
    ``core_limit``), so a schedule that is missing never means the whole GPU: policy 3's share is
    the container's own, policy 2's is its weight in slices of 1 / max pods, and 0, 1 and 4 give
    at least one such slice when the GPU holds all the pods it may. Rounded down, at least 1.
    """
    if max_pods < 1:
        raise PolicyError(f"max_pods={max_pods} must be at least 1")
    if policy is Policy.FIXED:
        pct = fixed_pct
    else:
        slices = weight if policy is Policy.WEIGHTED else 1
        pct = CORE_PER_GPU * slices // max_pods
    return max(1, min(CORE_PER_GPU, pct))


def schedule(
    policy: Policy,
    members: list[Member],
    *,
    max_pods: int,
    epoch_ns: int,
    period_ns: int = DEFAULT_PERIOD_NS,
) -> Schedule:
    """Lay the members' shares out as consecutive slots of one period.

    Shares that add up to more than the period (policy 3 with shares above 100 % in all, which
    the scheduler does not place) are scaled down together, so nobody's slot overlaps another's.
    Policy 4's remainder becomes one open window at the end of the period.
    """
    owned = shares(policy, members, max_pods)
    total = sum(owned.values())
    scale = 1 / total if total > 1 else 1.0
    slots: list[Slot] = []
    at = 0
    for member in members:
        if member.slot not in owned:
            continue
        length = int(owned[member.slot] * scale * period_ns)
        if length > 0:
            slots.append(Slot(member.slot, at, length))
            at += length
    if policy is Policy.SOFT and members and period_ns - at > 0:
        slots.append(Slot(OPEN, at, period_ns - at))
    return Schedule(policy, period_ns, epoch_ns, tuple(slots), tuple(members))
