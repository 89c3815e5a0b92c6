"""Fragmentation-aware node policies for the extender: ``fgd`` and ``gpushare``.

A node is liked by how little placing the pod grows its GPU fragmentation (FGD, USENIX ATC'23),
measured with ``core.fragmentation`` against the workload expected next. The extender counts in
the node's memory units, so a GPU's free share is its free memory units (an unhealthy GPU has
none) and a pod's shape is ``Shape(cpu=0, per_gpu=memory units per GPU, count=GPUs)``.

CPU is not tracked (``cpu=0`` for every shape and node): kube-scheduler's own NodeResourcesFit
filters CPU, and the ledger only knows the pods that hold GPU memory, so the extender cannot know
a node's free CPU. Computing power on ``core_mem`` nodes is not part of the measure either; the
filter still enforces it. GPU models are not used: gpushare pods cannot name one.

The target workload is learned from the extender's own view of past pods: the cluster cache
hands every pod it lists or watches to ``WorkloadFeed.observe``, which counts each pod with a GPU
request once (by UID). Until one has been seen both policies behave exactly as ``binpack``.

- ``fgd``: the paper's score, ``floor(100 * sigmoid(-growth / one GPU))``, one GPU being the
  node's mean GPU memory; a one-GPU pod goes to the fitting GPU with the best truncated score,
  the lowest index among equals (as the artifact's first-best).
- ``gpushare``: the same without the integer truncation (few ties), with fragmentation counted
  by copies (``core.fragmentation``): three free GPUs hold one two-GPU pod, not one and a half.
  Without CPU here this only changes multi-GPU shapes. Among GPUs of equal growth the tightest
  (least memory left) wins, then the lowest index.

Pods over several GPUs keep the filter's best-fit choice, and nodes labelled
``ack.node.gpu.placement=spread`` keep their most-free choice: the policy only scores them.
So does a node whose hand-off invariant needs particular GPUs (the filter decides there).
"""

from __future__ import annotations

from collections.abc import Sequence

from gpushare.core.fragmentation import Shape, WorkloadEstimate, fgd_score, fragmentation
from gpushare.core.inventory import NodeInventory
from gpushare.core.kubejson import KubeObject, uid_of
from gpushare.core.ledger import NodeUsage
from gpushare.core.names import DEFAULT_NAMES, ResourceNames
from gpushare.core.placing import Candidate
from gpushare.core.requests import PodRequest, read_pod
from gpushare.core.scoring import Binpack, PolicyRegistry, Spread
from gpushare.core.units import MemoryUnit

SETTLE = 0.25
"""After the first 100 pods, the target workload is refreshed every quarter of the pods seen."""

MEMO_LIMIT = 500_000
"""Fragmentation values remembered per workload version before the memo starts over."""


def shape_of(request: PodRequest) -> Shape:
    """The request as a target-workload shape, in memory units (CPU not tracked)."""
    return Shape(cpu=0, per_gpu=request.mem_per_gpu, count=request.gpu_count)


def free_units(node: NodeInventory, usage: NodeUsage) -> tuple[int, ...]:
    """Free memory units per GPU, in inventory order; an unhealthy GPU offers nothing."""
    on = usage.gpus
    return tuple(
        max(0, g.mem_units - (on[g.index].mem_units if g.index in on else 0)) if g.healthy else 0
        for g in node.gpus
    )


class WorkloadFeed:
    """The target workload, learned from the pods the cache has seen, each counted once.

    UIDs are kept only while their pods exist (``forget`` on deletion, ``retain`` after a
    relist), so the memory stays proportional to the live pods while the counts keep history.
    """

    def __init__(
        self,
        *,
        names: ResourceNames = DEFAULT_NAMES,
        unit: MemoryUnit = MemoryUnit.GiB,
        estimate: WorkloadEstimate | None = None,
    ) -> None:
        self.names = names
        self.unit = unit
        self.estimate = estimate or WorkloadEstimate(settle=SETTLE)
        self._uids: set[str] = set()

    @property
    def seen(self) -> int:
        """How many pods with a GPU request were counted."""
        return self.estimate.seen

    @property
    def version(self) -> int:
        """Changes whenever the target workload does (scores cached before are stale)."""
        return self.estimate.version

    def workload(self) -> tuple[tuple[Shape, float], ...]:
        """The current target workload."""
        return self.estimate.top()

    def observe(self, pod: KubeObject) -> bool:
        """Count a pod once if it asks for GPU memory; True when it was counted now."""
        uid = uid_of(pod)
        if not uid or uid in self._uids:
            return False
        request = read_pod(pod, names=self.names, unit=self.unit)
        if not isinstance(request, PodRequest) or not request.wants_gpu:
            return False
        self._uids.add(uid)
        self.estimate.observe(shape_of(request))
        return True

    def forget(self, uid: str) -> None:
        """A deleted pod's UID cannot come back; stop remembering it (its count stays)."""
        self._uids.discard(uid)

    def retain(self, uids: set[str]) -> None:
        """After a relist: keep only the UIDs of pods that still exist."""
        self._uids &= uids


class FragmentationPolicy:
    """Likes a node by how little the placement grows its fragmentation (see module docstring)."""

    def __init__(
        self, name: str, feed: WorkloadFeed, *, truncate: bool, tight: bool, copies: bool = False
    ) -> None:
        self.name = name
        self.feed = feed
        self.truncate = truncate
        self.tight = tight
        self.copies = copies
        self._fallback = Binpack()
        self._memo: dict[tuple[int, ...], float] = {}
        self._memo_version = -1

    @property
    def version(self) -> int:
        """Scores and GPU choices cached under another version are stale."""
        return self.feed.version

    @property
    def active(self) -> bool:
        """False until a pod has been seen: the policy is binpack until then."""
        return self.feed.seen > 0

    def _fragmentation(self, free: tuple[int, ...]) -> float:
        """The node's fragmentation for a free vector, remembered per workload version.

        The measure counts GPUs, not their order (no CPU or model here), so the vector is
        remembered sorted: nodes holding the same shares on other GPUs share one entry, which
        keeps re-scoring after a workload refresh cheap on a filling cluster.
        """
        if self._memo_version != self.feed.version or len(self._memo) >= MEMO_LIMIT:
            self._memo.clear()
            self._memo_version = self.feed.version
        key = tuple(sorted(free))
        value = self._memo.get(key)
        if value is None:
            value = self._memo[key] = fragmentation(
                key, 0, "", self.feed.workload(), copies=self.copies
            )
        return value

    def growth(
        self, request: PodRequest, node: NodeInventory, usage: NodeUsage, gpus: Sequence[int]
    ) -> float:
        """How much placing the pod on ``gpus`` grows the node's fragmentation, in units."""
        free = free_units(node, usage)
        after = list(free)
        position = {g.index: i for i, g in enumerate(node.gpus)}
        for index in gpus:
            after[position[index]] -= request.mem_per_gpu
        return self._fragmentation(tuple(after)) - self._fragmentation(free)

    def score(
        self, request: PodRequest, node: NodeInventory, usage: NodeUsage, gpus: tuple[int, ...]
    ) -> float:
        """FGD's score over 0..1: 0.5 for no growth, higher when fragmentation shrinks."""
        if not self.active or not gpus or not node.gpus:
            return self._fallback.score(request, node, usage, gpus)
        scale = node.mem_units_total / len(node.gpus)  # one GPU, as the paper's 1000 milli
        value = fgd_score(self.growth(request, node, usage, gpus), scale, truncate=self.truncate)
        return value / 100.0

    def choose(
        self,
        request: PodRequest,
        node: NodeInventory,
        usage: NodeUsage,
        fitting: Sequence[Candidate],
    ) -> tuple[int, ...]:
        """The GPU with the least growth for a one-GPU pod; () to keep the filter's choice."""
        if not self.active or request.gpu_count != 1 or len(fitting) < 2:
            return ()
        free = free_units(node, usage)
        before = self._fragmentation(free)
        position = {g.index: i for i, g in enumerate(node.gpus)}
        scale = node.mem_units_total / len(node.gpus)
        best: tuple[float, int, int] | None = None
        for candidate in fitting:
            after = list(free)
            after[position[candidate.gpu]] -= request.mem_per_gpu
            growth = self._fragmentation(tuple(after)) - before
            if self.truncate:  # the paper compares truncated scores
                growth = -fgd_score(growth, scale, truncate=True)
            key = (growth, candidate.mem_left if self.tight else 0, candidate.gpu)
            if best is None or key < best:
                best = key
        return (best[2],) if best is not None else ()


def fragmentation_policies(feed: WorkloadFeed) -> tuple[FragmentationPolicy, ...]:
    """``fgd`` and ``gpushare`` over one workload feed."""
    return (
        FragmentationPolicy("fgd", feed, truncate=True, tight=False),
        FragmentationPolicy("gpushare", feed, truncate=False, tight=True, copies=True),
    )


def all_policies(feed: WorkloadFeed | None = None) -> PolicyRegistry:
    """Every extender policy: ``binpack``, ``spread``, ``fgd``, ``gpushare``."""
    return PolicyRegistry(Binpack(), Spread(), *fragmentation_policies(feed or WorkloadFeed()))
