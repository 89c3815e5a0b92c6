"""Whether the API server is refusing one of a process's lists and watches, and why.

A watch the API server refuses looks, from inside the loop that runs it, like any other
failure: the loop waits its backoff and tries again, for ever. When the refusal is RBAC's (the
chart's ClusterRole lacks the verb), trying again never helps, and the process goes on
working from a store that stopped following the cluster: the device plugin whose pod watch
was refused marked no pod served, and the hand-off rule then held pods Pending with GPUs free,
while the only trace was a warning a minute among the retries. So every list-then-watch loop
(``kube.podwatch``, ``kube.cache``, ``kube.policies``) reports each step's outcome here, and
this one place turns them into what an operator sees:

- an ERROR log when a step starts being refused, naming the resource, the verb, the identity
  (from the API server's answer, where it says it) and what to do; an INFO line when it works
  again, and nothing in between (the loops' own retry lines stay warnings);
- ``refusals()``: what is refused now, for ``/readyz`` (not ready, with the reason) and for the
  ``*_watch_refused`` gauges and their alerts.

A step is refused when the server answers 403 (``forbidden``) or 401 (``unauthorized``), or
when it failed ``failing_after`` times in a row for any other reason (``failing``: a proxy that
cuts every stream, a server that keeps timing out). It counts as refused until it succeeds (a
list answers, a watch delivers an event) or until ``hold_s`` pass without another failure: a
watch that was granted its verb and then opens on a quiet node may deliver no event for
minutes, and the loops retry at most every ``Backoff.cap_s`` (30 s), so a refusal still going
on is seen again well within ``hold_s``.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from gpushare.kube.port import Forbidden, Gone, KubeError, NotFound, Unauthorized

log = logging.getLogger(__name__)

FAILING_AFTER = 5
"""Failures in a row, none of them 401 or 403, after which a step counts as refused."""
HOLD_S = 90.0
"""Seconds a refusal stands without a new failure (three times the backoff's longest wait)."""

_USER = re.compile(r'User "([^"]+)"')
"""How kube-apiserver's 403 names the identity (``User "system:serviceaccount:ns:sa" cannot
watch resource "pods" ...``)."""


def reason_of(err: KubeError) -> str:
    """``forbidden``, ``unauthorized`` or ``failing``: the ``reason`` label of a refusal."""
    if isinstance(err, Forbidden):
        return "forbidden"
    if isinstance(err, Unauthorized):
        return "unauthorized"
    return "failing"


def identity_in(text: str) -> str:
    """The user a 403 names, or '' where the answer does not say."""
    found = _USER.search(text)
    return found.group(1) if found else ""


@dataclass(frozen=True)
class Refusal:
    """One list or watch the API server refuses now."""

    resource: str
    """The resource as RBAC names it (``pods``, ``nodes``, ``resourcepolicies``)."""
    verb: str
    """``list`` or ``watch``."""
    reason: str
    """``forbidden``, ``unauthorized`` or ``failing`` (see the module)."""
    detail: str
    """The last error, as the API port wrote it."""
    identity: str
    """Who asked, where known."""
    failures: int
    """Failures in a row."""

    def advice(self, role: str) -> str:
        """What to do, for the log and ``/readyz``."""
        who = f" to {self.identity}" if self.identity else ""
        if self.reason == "forbidden":
            return (
                f"grant '{self.verb}' on '{self.resource}'{who} in {role} (the chart's "
                "templates grant it: upgrade the release, or restore an edited role)"
            )
        if self.reason == "unauthorized":
            return (
                "the API server does not accept these credentials: check the ServiceAccount token"
            )
        return "check the API server and what lies between (a proxy cutting streams, a timeout)"

    def text(self, role: str) -> str:
        """One line: what is refused, why, and what to do."""
        return (
            f"{self.verb} {self.resource} refused ({self.reason}, {self.failures} in a row): "
            f"{self.detail}; {self.advice(role)}"
        )[:600]


class WatchHealth:
    """The refused lists and watches of one process (see the module)."""

    def __init__(
        self,
        *,
        role: str,
        failing_after: int = FAILING_AFTER,
        hold_s: float = HOLD_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.role = role
        """Where the verbs are granted, for the advice (the chart's ClusterRole's name)."""
        self.failing_after = failing_after
        self.hold_s = hold_s
        self._clock = clock
        self._failures: dict[tuple[str, str], tuple[int, float, KubeError]] = {}
        """Per (resource, verb): failures in a row, when the last came, and what it was."""
        self._told: set[tuple[str, str]] = set()
        """Steps whose refusal was logged (so that it is logged once, and its end too)."""

    def failed(self, resource: str, verb: str, err: KubeError) -> None:
        """Count a failure of ``verb`` on ``resource``; log the first that makes it refused."""
        key = (resource, verb)
        count = self._failures.get(key, (0, 0.0, err))[0] + 1
        self._failures[key] = (count, self._clock(), err)
        refusal = self._refusal(key)
        if refusal is not None and key not in self._told:
            self._told.add(key)
            log.error(
                "resource=%s verb=%s phase=watch-refused identity=%s %s",
                resource,
                verb,
                refusal.identity or "unknown",
                refusal.text(self.role),
            )

    @contextmanager
    def step(self, resource: str, verb: str) -> Iterator[None]:
        """Count the enclosed list or watch's failure, then let it go on to the caller's retry.

        A Gone is not one (the server's window moved on: the caller relists), nor a NotFound
        (an answer: the ResourcePolicy CRD is not installed).
        """
        try:
            yield
        except (Gone, NotFound):
            raise
        except KubeError as err:
            self.failed(resource, verb, err)
            raise

    def succeeded(self, resource: str, verb: str) -> None:
        """``verb`` on ``resource`` went through: it is not refused any more."""
        key = (resource, verb)
        if self._failures.pop(key, None) is not None and key in self._told:
            self._told.discard(key)
            log.info("resource=%s verb=%s phase=watch-refused answered again", resource, verb)

    def _refusal(self, key: tuple[str, str]) -> Refusal | None:
        held = self._failures.get(key)
        if held is None:
            return None
        count, at, err = held
        reason = reason_of(err)
        if reason == "failing" and count < self.failing_after:
            return None
        if self._clock() - at > self.hold_s:
            return None
        text = str(err)
        return Refusal(key[0], key[1], reason, text[:300], identity_in(text), count)

    def refusals(self) -> list[Refusal]:
        """What is refused now, in a stable order."""
        # a copy: /readyz and the metrics read this from their own threads
        found = (self._refusal(key) for key in sorted(self._failures.copy()))
        return [r for r in found if r is not None]

    def rows(self) -> list[tuple[str, str, str]]:
        """(resource, verb, reason) of each refused step: the ``*_watch_refused`` series."""
        return [(r.resource, r.verb, r.reason) for r in self.refusals()]

    def problem(self) -> str:
        """Why the process is not ready, '' while nothing is refused (``/readyz``)."""
        return "; ".join(r.text(self.role) for r in self.refusals())
