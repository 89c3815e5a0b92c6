"""Removing the node's startup taint once kubelet took the device plugin's registration.

Why the taint and when it goes are ``core.model.startuptaint``'s; this module reads the node
and writes the patch. The device plugin runs :func:`release_when_serving` beside its other
work from the moment it registered with kubelet; a test runs the same function for a kwok node,
whose allocatable the test writes in kubelet's place.

It reads its one node with GET (the plugin may not list or watch nodes: its ClusterRole grants
``get`` and ``patch``), every ``interval_s`` while the taint is there and kubelet does not
allocate the GPU memory yet: kubelet writes that figure within ``nodeStatusUpdateFrequency``
(10 s) of the registration, so a new node costs the API server a handful of reads, and a node
without the taint one (the loop ends as soon as no taint is left). The write is the core's JSON
patch, whose ``test`` operations make the API server refuse it when the node changed since the
reading; the node is then read again and the decision made anew, at once, up to
``CONFLICTS`` times in a row, then after ``interval_s``. Any other failure (the API server away,
a refusal) is logged and tried again after ``interval_s``: the taint only delays the autoscaler's
view of the node, and removing it later is always right.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from gpushare.core.model.startuptaint import Step, TaintRelease, release
from gpushare.kube.port import Conflict, KubeAPI, KubeError

log = logging.getLogger(__name__)

INTERVAL_S = 2.0
"""Seconds between readings of the node while kubelet does not allocate the GPU memory yet."""
CONFLICTS = 5
"""Refused writes (the node changed under the patch) re-decided at once before waiting."""


async def release_once(api: KubeAPI, node: str, *, key: str, resource: str) -> TaintRelease:
    """Read the node, decide and, when it is time, remove the taint; return the decision.

    A write refused because the node changed is read and decided again, at most ``CONFLICTS``
    times; the last refusal's Conflict is raised.
    """
    for attempt in range(CONFLICTS):
        decided = release(await api.get_node(node), key=key, resource=resource)
        if decided.step is not Step.REMOVE:
            return decided
        try:
            await api.patch_node_json(node, decided.patch)
        except Conflict:
            if attempt == CONFLICTS - 1:
                raise
            log.info(
                "node=%s taint=%s phase=startup-taint the node changed; reading it again", node, key
            )
            continue
        log.info("node=%s taint=%s phase=startup-taint %s", node, key, decided.reason)
        return decided
    raise AssertionError("unreachable")  # pragma: no cover


async def release_when_serving(
    api: KubeAPI,
    node: str,
    *,
    key: str,
    resource: str,
    interval_s: float = INTERVAL_S,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> TaintRelease:
    """Remove the startup taint ``key`` from ``node`` once kubelet allocates ``resource``.

    Returns the decision that ended it: REMOVE (removed here) or DONE (no such taint, or
    ``key`` is empty). Runs until then; cancel it to stop.
    """
    waited = ""
    while True:
        try:
            decided = await release_once(api, node, key=key, resource=resource)
        except KubeError as err:
            log.warning(
                "node=%s taint=%s phase=startup-taint cannot remove it yet: %s; trying again "
                "in %.0f s",
                node,
                key,
                err,
                interval_s,
            )
        else:
            if decided.step is not Step.WAIT:
                if decided.step is Step.DONE and key:
                    log.debug("node=%s phase=startup-taint %s", node, decided.reason)
                return decided
            if decided.reason != waited:
                log.info("node=%s phase=startup-taint %s", node, decided.reason)
                waited = decided.reason
        await sleep(interval_s)
