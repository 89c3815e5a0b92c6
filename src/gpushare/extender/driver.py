"""Calls the extender the way kube-scheduler does, for the demo and in-process tests.

For each pod: POST filter with every node name (``nodeCacheCapable``); when more than one node
passed, POST prioritize with them and pick the highest score (ties to the first name, where
kube-scheduler picks at random), else take the one node unscored, as kube-scheduler does
(``schedulePod`` in pkg/scheduler/schedule_one.go); POST bind. The outcome is a value: bound,
or unschedulable with the per-node reasons that kube-scheduler would put into the pod's
FailedScheduling event.

``Outcome.event`` writes the event's message as kube-scheduler v1.36 does for a pod that only
the extender refuses (``FitError.Error`` in pkg/scheduler/framework/types.go, checked against
the real control plane in tests/e2e/test_events.py): the reasons counted and sorted, then what
the post-filter plugins say. DynamicResources answers ``no new claims to deallocate`` for a pod
without claims; DefaultPreemption counts ``Preemption is not helpful for scheduling`` on nodes
refused as unresolvable and, on the others, ``No preemption victims found for incoming pod``,
which holds while no pod of lower priority runs there (true in the demo: no pod sets one).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from gpushare.core.model.kubejson import key_of, name_of, namespace_of, stored_uid_of


@dataclass(frozen=True)
class Outcome:
    """What happened to one pod."""

    pod: str
    node: str = ""
    failed: Mapping[str, str] = field(default_factory=dict)
    """Every refusing node's reason (FailedNodes and FailedAndUnresolvableNodes)."""
    error: str = ""
    unresolvable: frozenset[str] = frozenset()
    """The nodes refused as unresolvable (preemption would not help there)."""

    @property
    def bound(self) -> bool:
        """Whether the pod was bound."""
        return bool(self.node) and not self.error

    def event(self, total_nodes: int) -> str:
        """The Scheduled or FailedScheduling message kube-scheduler would record."""
        if self.bound:
            return f"Successfully assigned {self.pod} to {self.node}"
        if self.error:
            return f"binding rejected: {self.error}"
        reasons = _histogram(self.failed.values())
        victims = len(self.failed) - len(self.unresolvable)
        preemption = _histogram(
            ["No preemption victims found for incoming pod"] * victims
            + ["Preemption is not helpful for scheduling"] * (total_nodes - victims)
        )
        return (
            f"0/{total_nodes} nodes are available: {reasons}. no new claims to deallocate, "
            f"preemption: 0/{total_nodes} nodes are available: {preemption}."
        )


def _histogram(reasons: Iterable[str]) -> str:
    """``2 reason, 1 other``: counts before reasons, sorted as text (as kube-scheduler does)."""
    return ", ".join(sorted(f"{n} {r}" for r, n in Counter(reasons).items()))


class ExtenderDriver:
    """A minimal kube-scheduler loop over the extender's HTTP API."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client

    async def _post(self, verb: str, body: Mapping[str, Any]) -> Any:
        response = await self._client.post(f"/{verb}", json=body)
        response.raise_for_status()
        return response.json()

    async def schedule(self, pod: Mapping[str, Any], node_names: Sequence[str]) -> Outcome:
        """Filter, prioritize (when more than one node passed) and bind one pod."""
        key = key_of(pod)
        args = {"Pod": pod, "NodeNames": list(node_names)}
        result = await self._post("filter", args)
        if result.get("Error"):
            return Outcome(pod=key, error=result["Error"])
        unresolvable = result.get("FailedAndUnresolvableNodes") or {}
        failed = {**(result.get("FailedNodes") or {}), **unresolvable}
        passing = result.get("NodeNames") or []
        if not passing:
            return Outcome(pod=key, failed=failed, unresolvable=frozenset(unresolvable))
        best = passing[0]
        if len(passing) > 1:  # a lone node is taken unscored (schedulePod, schedule_one.go)
            scores = await self._post("prioritize", {"Pod": pod, "NodeNames": passing})
            best = max(scores, key=lambda s: s["Score"])["Host"] if scores else best
        bound = await self._post(
            "bind",
            {
                "PodName": name_of(pod),
                "PodNamespace": namespace_of(pod),
                "PodUID": stored_uid_of(pod),
                "Node": best,
            },
        )
        if bound.get("Error"):
            return Outcome(pod=key, error=bound["Error"], failed=failed)
        return Outcome(pod=key, node=best, failed=failed)
