"""Status: one value for how a check ended, with its code, its reasons and who said it.

kube-scheduler's framework answers every extension point with a ``Status{code, reasons}``
(pkg/scheduler/framework/interface.go): "does not fit" is a value, never an exception, and a
caller reads the code instead of asking which of several result types came back. gpushare's
checks do the same: the filter's verdict on a node, a ResourcePolicy unit at reserve, a bind
try, kubelet's ``Allocate``. Before this value each had its own refusal type, strings where
an empty one meant "no reason", and a hand-off deferral told apart by how its text began, so
callers sorted outcomes with ``isinstance`` tests and prefix matches.

The codes are the framework's (``Success``, ``Unschedulable``,
``UnschedulableAndUnresolvable``, ``Wait``, ``Skip``, ``Error``), plus two it has no name for:
``Conflict`` (an API write met a newer object: nothing was written, try again) and
``Invalid`` (the pod or its ResourcePolicy is wrong: no node takes it until it is fixed).
``source`` names the plugin or step that decided, as the framework's ``Status.Plugin()``
does: ``gpushare`` (the GPU filter; kubelet reads it in front of an Allocate refusal),
``handoff``, ``ResourcePolicy``, ``bind``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Code(Enum):
    """How a check ended; the values are the kube-scheduler framework's names."""

    SUCCESS = "Success"
    UNSCHEDULABLE = "Unschedulable"
    """Refused here now; may pass once something is freed (the extender's ``FailedNodes``)."""
    UNRESOLVABLE = "UnschedulableAndUnresolvable"
    """Never here as the node is (wrong mode, unit or size): preemption would not help."""
    WAIT = "Wait"
    """Fits once another pod has started: the device plugin's hand-off must tell them apart
    (``core.records.handoff``). Refused now, like ``UNSCHEDULABLE``."""
    SKIP = "Skip"
    """Nothing to do: the step's work is already done (a bind of a pod bound there)."""
    CONFLICT = "Conflict"
    """The object changed while it was written (an API 409): nothing was written; try again."""
    INVALID = "Invalid"
    """The pod's request or its ResourcePolicy is invalid: no node takes it until fixed."""
    ERROR = "Error"


_OK = frozenset({Code.SUCCESS, Code.SKIP})
_LATER = frozenset({Code.UNSCHEDULABLE, Code.WAIT})


@dataclass(frozen=True)
class Status:
    """How one check ended: its code, the reasons a person can act on, and who said it."""

    code: Code = Code.SUCCESS
    reasons: tuple[str, ...] = ()
    source: str = ""
    """The plugin or step that decided: ``gpushare``, ``handoff``, ``ResourcePolicy``, ``bind``."""
    message: str = field(init=False, repr=False, compare=False)
    """All reasons in one line; empty when there are none. Joined once, when the status is
    made: the extender sends it for every failing node, and an adapter reads it as a plain
    attribute, without a call back into the core."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "message", "; ".join(self.reasons))

    @property
    def ok(self) -> bool:
        """Whether nothing stands in the way (``Success``, or ``Skip``: already done)."""
        return self.code in _OK

    @property
    def is_success(self) -> bool:
        """Whether the check passed (the framework's ``IsSuccess``)."""
        return self.code is Code.SUCCESS

    @property
    def may_pass_later(self) -> bool:
        """Refused now, but may pass once something changes (``Unschedulable`` or ``Wait``),
        as opposed to refused for good here (``UnschedulableAndUnresolvable``)."""
        return self.code in _LATER

    @property
    def attributed(self) -> str:
        """The message with its source in front, as a peer reads it: ``gpushare: ...``."""
        return f"{self.source}: {self.message}"


SUCCESS = Status()
"""A check that passed with nothing to say."""


def refused(code: Code, reason: str, source: str) -> Status:
    """A status with one reason (the common case)."""
    return Status(code, (reason,), source)
