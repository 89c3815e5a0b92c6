"""The shared-GPU pods gpushare refused on every node it was asked about: the demand an
autoscaler cannot see by itself.

cluster-autoscaler and Karpenter simulate scheduling with node-level totals and never ask an
extender (../shared/docs/AUTOSCALERS.md 1a, 1c: CA's ``simulator/framework/handle.go`` builds
the in-tree framework only; Karpenter's ``pkg/utils/resources`` ``Fits``). A pod asking 8 GiB
beside a node whose four GPUs have 3 GiB free each "fits" that node by its 12 GiB free, so
neither adds a node (CA's ``core/podlistprocessor/filter_out_schedulable.go``). The filter
knows better: when it refuses a valid GPU pod on every node kube-scheduler offered, the pod
is short of a GPU that holds it, and ``core.autoscaling.placeholders`` turns that into pods
an autoscaler does understand.

A ``Shortfall`` keeps what the plan needs of that refusal and nothing per node: the largest
GPU among the nodes that refused the pod for want of room (the shape a new node of that pool
would bring), and the newest of all the nodes it was refused on, by creation time (so a
placeholder made before a node joined is known to be stale once that node refuses the pod
too). The book is bounded, oldest first, as the filter's other per-pod books are.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Shortfall:
    """A pending GPU pod that no node it was offered could hold, as of its last filter."""

    uid: str
    namespace: str
    name: str
    gpu_mib: int
    """The largest in-service GPU, in MiB, among the nodes that refused the pod for want of
    room (not those that can never take it); 0 when none did."""
    newest_node_s: float
    """The creation time (API server clock, seconds) of the newest node it was refused on."""
    since_ns: int
    """When the filter first refused it, of the refusals in a row (the extender's clock)."""

    @property
    def key(self) -> str:
        """``namespace/name`` for messages."""
        return f"{self.namespace}/{self.name}"


class Shortfalls:
    """Refused GPU pods by UID, newest refusal last, at most ``limit`` of them."""

    def __init__(self, *, limit: int = 10_000) -> None:
        if limit < 1:
            raise ValueError(f"Shortfalls limit={limit} is refused: it must be at least 1")
        self._limit = limit
        self._pods: dict[str, Shortfall] = {}

    def __len__(self) -> int:
        return len(self._pods)

    def __contains__(self, uid: object) -> bool:
        return uid in self._pods

    def __iter__(self) -> Iterator[Shortfall]:
        return iter(list(self._pods.values()))

    def get(self, uid: str) -> Shortfall | None:
        """The pod's shortfall, if it has one."""
        return self._pods.get(uid)

    def refused(self, shortfall: Shortfall) -> None:
        """Remember the pod's newest refusal, keeping when the first of a row was; past the
        limit the oldest is forgotten."""
        before = self._pods.pop(shortfall.uid, None)
        if before is not None and before.since_ns < shortfall.since_ns:
            shortfall = replace(shortfall, since_ns=before.since_ns)
        self._pods[shortfall.uid] = shortfall
        while len(self._pods) > self._limit:
            del self._pods[next(iter(self._pods))]

    def forget(self, uid: str) -> None:
        """The pod fits somewhere now, or is bound or gone."""
        self._pods.pop(uid, None)

    def retain(self, uids: Iterable[str]) -> None:
        """Keep only these pods (after a relist: the others are bound or gone)."""
        alive = set(uids)
        for uid in [u for u in self._pods if u not in alive]:
            del self._pods[uid]
