"""Kubernetes Events on pods: where a pod was placed (and in which ResourcePolicy unit), why no
node fits, or why its allocation annotation is ignored; and on ResourcePolicies, what in one
gpushare accepts but does not do.

kube-scheduler retries an unschedulable pod many times a minute, so events are deduplicated:
the same pod with the same reason and message updates one Event's ``count`` and
``lastTimestamp`` (at most once per ``min_interval_s``) instead of creating a new one, as
kubelet and kube-scheduler do. Writes happen on one background worker in order, never in the
decision's path; a failed write is logged and forgotten, so events can never break scheduling.

Normal events (where a pod went) are capped by a token bucket, ``normal_per_s`` a second with a
burst of ``normal_burst`` (five seconds' worth unless given): a burst of thousands of binds
would otherwise add one API write (and one etcd write) per pod on top of the binding, to repeat
what the pod's allocation annotation and kube-scheduler's own ``Scheduled`` event already say.
The ones past the cap are not written and are counted (``skipped``; the extender's
``gpushare_events_skipped_total``). Warnings are never capped: each says why a pod waits, and
deduplication already bounds them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from gpushare.core.model.kubejson import KubeObject, name_of, namespace_of, stored_uid_of
from gpushare.kube.port import KubeAPI, KubeError

log = logging.getLogger(__name__)

COMPONENT = "gpushare-extender"
SCHEDULED = "GPUShareScheduled"
UNSCHEDULABLE = "GPUShareUnschedulable"
UNTRUSTED = "GPUShareUntrustedAllocation"
POLICY_UNIT = "GPUSharePolicyUnit"
POLICY_NOTICE = "GPUSharePolicyNotice"
WAITING_FOR_NODE = "GPUShareWaitingForNode"
"""Normal: a placeholder asks the autoscaler for a node for the pod (``extender.autoscaling``)."""

EventKind = Literal["Normal", "Warning"]

NORMAL_PER_S = 2.0
"""The default cap on Normal Events a second (``EventRecorder``, ``--normal-events-per-second``):
a cluster placing fewer GPU pods a second gets one for every pod, a burst its first few."""


@dataclass(frozen=True)
class PodRef:
    """The object an event is about (``involvedObject``): a pod unless told otherwise."""

    namespace: str
    name: str
    uid: str
    kind: str = "Pod"
    api_version: str = "v1"

    @classmethod
    def of(cls, pod: KubeObject) -> PodRef:
        """The pod's identity as stored (an unstored pod's uid is empty)."""
        return cls(namespace=namespace_of(pod), name=name_of(pod), uid=stored_uid_of(pod))


@dataclass
class _Seen:
    name: str
    count: int
    first: str
    sent_at: float
    created: bool = False


@dataclass(frozen=True)
class _Write:
    pod: PodRef
    kind: EventKind
    reason: str
    message: str
    key: tuple[str, str, str]


def _timestamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class EventRecorder:
    """Records deduplicated core/v1 Events through the Kubernetes port."""

    def __init__(
        self,
        api: KubeAPI,
        *,
        instance: str = "",
        min_interval_s: float = 10.0,
        max_remembered: int = 4096,
        max_queued: int = 1024,
        normal_per_s: float = NORMAL_PER_S,
        normal_burst: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if normal_burst is None:  # five seconds' worth
            normal_burst = max(1, round(5 * normal_per_s))
        if normal_per_s < 0 or normal_burst < 0:
            raise ValueError(
                f"normal_per_s={normal_per_s}, normal_burst={normal_burst}: must be 0 or more "
                f"(0 writes no Normal events)"
            )
        self._api = api
        self._instance = instance or socket.gethostname()
        self._min_interval = min_interval_s
        self._max_remembered = max_remembered
        self._clock = clock
        self._seen: OrderedDict[tuple[str, str, str], _Seen] = OrderedDict()
        self._queue: asyncio.Queue[_Write] = asyncio.Queue(maxsize=max_queued)
        self._worker: asyncio.Task[None] | None = None
        self.dropped = 0
        """Events not written because the queue was full or no event loop ran."""
        self.failures = 0
        """Writes the API refused (logged, never raised)."""
        self.skipped = 0
        """Normal events not queued because the bucket was empty (``allows``)."""
        self._rate = normal_per_s
        self._burst = float(normal_burst) if normal_per_s else 0.0
        self._tokens = self._burst
        self._filled_at: float | None = None

    def allows(self, kind: EventKind) -> bool:
        """Whether an event of this kind may be recorded now; a Normal one takes a token.

        Ask before building the message: a skipped placement event then costs nothing.
        """
        if kind != "Normal":
            return True
        now = self._clock()
        if self._filled_at is not None:
            elapsed = max(0.0, now - self._filled_at)  # a clock set back adds nothing
            self._tokens = min(self._burst, self._tokens + elapsed * self._rate)
        self._filled_at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        self.skipped += 1
        return False

    def record(self, pod: PodRef, kind: EventKind, reason: str, message: str) -> None:
        """Queue an event; returns at once and never raises."""
        if not pod.name:
            return
        key = (pod.uid or f"{pod.namespace}/{pod.name}", reason, message)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.dropped += 1
            return
        if self._worker is None or self._worker.done():
            self._worker = loop.create_task(self._work())
        try:
            self._queue.put_nowait(_Write(pod, kind, reason, message, key))
        except asyncio.QueueFull:
            self.dropped += 1

    async def drain(self) -> None:
        """Wait until every queued event was written (tests, shutdown)."""
        if self._worker is not None and not self._worker.done():
            await self._queue.join()

    async def close(self) -> None:
        """Stop the worker."""
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker

    async def _work(self) -> None:
        while True:
            write = await self._queue.get()
            try:
                await self._write(write)
            except KubeError as err:
                self.failures += 1
                log.warning(
                    "pod=%s/%s reason=%s phase=event cannot write: %s",
                    write.pod.namespace,
                    write.pod.name,
                    write.reason,
                    err,
                )
            except Exception:  # an event must never take the extender down
                self.failures += 1
                log.exception(
                    "pod=%s/%s phase=event unexpected error", write.pod.namespace, write.pod.name
                )
            finally:
                self._queue.task_done()

    async def _write(self, write: _Write) -> None:
        now = self._clock()
        seen = self._seen.get(write.key)
        if seen is not None and seen.created:
            seen.count += 1
            self._seen.move_to_end(write.key)
            if now - seen.sent_at < self._min_interval:
                return
            seen.sent_at = now
            await self._api.patch_event(
                write.pod.namespace,
                seen.name,
                {"count": seen.count, "lastTimestamp": _timestamp(now)},
            )
            return
        if seen is not None and now - seen.sent_at < self._min_interval:
            return  # creating it failed a moment ago: do not hammer the API
        name = f"{write.pod.name[:200]}.{time.time_ns():x}"
        seen = _Seen(name=name, count=1, first=_timestamp(now), sent_at=now)
        self._seen[write.key] = seen
        while len(self._seen) > self._max_remembered:
            self._seen.popitem(last=False)
        await self._api.create_event(write.pod.namespace, self._body(write, seen))
        seen.created = True

    def _body(self, write: _Write, seen: _Seen) -> dict[str, Any]:
        pod = write.pod
        involved = {
            "apiVersion": pod.api_version,
            "kind": pod.kind,
            "namespace": pod.namespace,
            "name": pod.name,
        }
        if pod.uid:
            involved["uid"] = pod.uid
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": seen.name, "namespace": pod.namespace},
            "involvedObject": involved,
            "type": write.kind,
            "reason": write.reason,
            "message": write.message,
            "count": 1,
            "firstTimestamp": seen.first,
            "lastTimestamp": seen.first,
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self._instance,
            "action": "Scheduling",
        }
