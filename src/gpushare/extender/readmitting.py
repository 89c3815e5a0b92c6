"""Bring back the GPU pods kubelet refused while their node's device plugin was not serving.

The decision is ``core.records.readmission``'s; this module acts on it for the pods the cache sees
Failed: an event on each refused pod, and for a bare pod its deletion and re-creation under
the same name, with an event on the new pod that names the old one. Each pod (by UID) is
handled once; the re-creations of one name are counted, so a node that keeps refusing cannot
make a loop of it.

Once across restarts too: a pod left Failed (re-creation off, the chart's default, or a
controller's pod) stays in the cluster, and an extender started later lists it again. The
event's text cannot be looked up without the right to list events, so the pod itself carries
the fact: ``gpushare.io/refusal-reported`` (the time) is written on it with the event, and a pod
that has it is not reported again. The annotation is on the refused pod, written by the
extender that may already patch pods, and gone with the pod; a replacement does not inherit it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from datetime import UTC, datetime
from typing import Any

from gpushare.core.model.kubejson import stored_uid_of
from gpushare.core.model.names import ANN_REFUSAL_REPORTED, ResourceNames
from gpushare.core.records.readmission import Step, readmission, replacement
from gpushare.extender.events import EventRecorder, PodRef
from gpushare.kube.port import Conflict, KubeAPI, KubeDict, KubeError, NotFound

log = logging.getLogger(__name__)

REFUSED = "RefusedByKubelet"
"""Event reason on the refused pod."""
RECREATED = "Recreated"
"""Event reason on the pod created in its place."""
CREATE_TRIES = 20
CREATE_WAIT_S = 0.5
"""A deleted Failed pod leaves at once, but the watch that shows it may lag: try again."""


class Readmitter:
    """Acts on refused GPU pods as the cache sees them (``PodTaken.failed``, ``Extender.take``)."""

    def __init__(
        self,
        api: KubeAPI,
        *,
        names: ResourceNames,
        events: EventRecorder,
        recreate: bool = True,
    ) -> None:
        self.api = api
        self.names = names
        self.events = events
        self.recreate = recreate
        """False: only the events, never a deletion or creation (``--no-recreate-refused-pods``)."""
        self._handled: set[str] = set()
        self._recreations: dict[tuple[str, str], int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.counts: dict[str, int] = {"controller": 0, "recreated": 0, "left": 0, "error": 0}

    def seen(self, pod: KubeDict) -> None:
        """A Failed pod was listed or watched: act on it once if kubelet refused it."""
        uid = stored_uid_of(pod)
        if not uid or uid in self._handled:
            return
        meta = pod.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        decided = readmission(
            pod, self.names, self._recreations.get(key, 0), recreate=self.recreate
        )
        if decided.step is Step.NOTHING and not decided.why:
            return
        self._handled.add(uid)
        ref = PodRef.of(pod)
        self.events.record(ref, "Warning", REFUSED, decided.why)
        log.warning("pod=%s/%s uid=%s phase=readmission %s", *key, uid, decided.why)
        if decided.step is not Step.RECREATE or not self.recreate:  # it stays: mark it
            self._spawn(self._mark(pod))
        if decided.step is Step.CONTROLLER:
            self.counts["controller"] += 1
        elif decided.step is Step.RECREATE and self.recreate:
            self._recreations[key] = self._recreations.get(key, 0) + 1
            self._spawn(self._replace(pod, uid))
        else:
            self.counts["left"] += 1

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        try:
            task = asyncio.get_running_loop().create_task(work)
        except RuntimeError:  # no loop: a synchronous test of the cache
            work.close()
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _mark(self, pod: KubeDict) -> None:
        """Write ``gpushare.io/refusal-reported`` on a refused pod that stays (see the module)."""
        meta = pod.get("metadata") or {}
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        stamp = {ANN_REFUSAL_REPORTED: datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
        version = str(meta.get("resourceVersion") or "")
        for _ in range(2):  # a Conflict: kubelet or a controller wrote it meanwhile, read again
            try:
                await self.api.patch_pod_annotations(
                    namespace, name, stamp, resource_version=version
                )
                return
            except Conflict:
                try:
                    version = (await self.api.get_pod(namespace, name))["metadata"][
                        "resourceVersion"
                    ]
                except KubeError:
                    return
            except KubeError as err:
                log.info("pod=%s/%s phase=readmission not marked: %s", namespace, name, err)
                return

    async def _replace(self, pod: KubeDict, uid: str) -> None:
        fresh = replacement(pod)
        namespace, name = fresh["metadata"]["namespace"], fresh["metadata"]["name"]
        try:
            await self.api.remove_pod(namespace, name, uid=uid)
        except NotFound:
            log.info("pod=%s/%s phase=readmission gone or replaced already", namespace, name)
            return
        except KubeError as err:
            self.counts["error"] += 1
            log.warning("pod=%s/%s phase=readmission not deleted: %s", namespace, name, err)
            return
        for _ in range(CREATE_TRIES):
            try:
                created = await self.api.add_pod(fresh)
            except Conflict:
                await asyncio.sleep(CREATE_WAIT_S)
                continue
            except KubeError as err:
                self.counts["error"] += 1
                log.warning("pod=%s/%s phase=readmission not re-created: %s", namespace, name, err)
                return
            self.counts["recreated"] += 1
            self.events.record(
                PodRef.of(created),
                "Normal",
                RECREATED,
                f"gpushare re-created this pod in place of UID {uid}, which kubelet on "
                f"{(pod.get('spec') or {}).get('nodeName') or 'its node'} refused while no "
                "device plugin served its GPU resources (none of its containers ran)",
            )
            return
        self.counts["error"] += 1
        log.warning("pod=%s/%s phase=readmission the name stayed taken", namespace, name)
