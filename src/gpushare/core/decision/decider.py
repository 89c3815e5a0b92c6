"""One pod on one node: the filter's verdict, the policy's GPU choice, the hand-off, the score.

Everything the decision caches remember comes from ``Decider.decide``, and everything it reads
from the request is in ``Decider.key``: two pods with equal keys get equal decisions on a node
holding the same usage. The policy's ``version`` says when remembered scores and GPU choices
went stale (a fragmentation-aware policy's target workload changed).
"""

from __future__ import annotations

from collections.abc import Sequence

from gpushare.core.booking.ledger import NodeUsage
from gpushare.core.model.inventory import NodeInventory
from gpushare.core.model.requests import PodRequest
from gpushare.core.placement.filtering import GpuChooser, Rules, Verdict, filter_node
from gpushare.core.placement.placing import Candidate
from gpushare.core.placement.scoring import ChoosingPolicy, NodePolicy
from gpushare.core.records.allocation import plan
from gpushare.core.records.handoff import conflict, pending_of, preferred_gpus

Decision = tuple[Verdict, float]
"""A node's verdict and the policy's score in [0, 1] (0 when it does not fit)."""


def shape_key(request: PodRequest) -> tuple[object, ...]:
    """What a verdict depends on in a request: pods with equal keys get equal verdicts."""
    return (
        request.mem_per_gpu,
        request.core_per_gpu,
        request.gpu_count,
        request.mem_units,
        tuple((c.kind, c.mem_units, c.core_pct) for c in request.containers),
    )


def with_handoff(
    request: PodRequest,
    node: NodeInventory,
    usage: NodeUsage,
    rules: Rules,
    chooser: GpuChooser | None = None,
) -> Verdict:
    """Filter, then keep the hand-off invariant on nodes whose device plugin relies on it."""
    verdict = filter_node(request, node, usage, rules=rules, chooser=chooser)
    if not (verdict.fits and node.handoff):
        return verdict
    pending = pending_of(usage.allocations)
    if not pending:
        return verdict
    broken = conflict(plan(request, node=node.name, indexes=verdict.gpus, unit=node.unit), pending)
    if broken is None:
        return verdict
    prefer = preferred_gpus((c.mem_units for c in request.containers), pending)
    if prefer:
        again = filter_node(request, node, usage, rules=rules, prefer=prefer)
        if again.fits and (
            conflict(plan(request, node=node.name, indexes=again.gpus, unit=node.unit), pending)
            is None
        ):
            return again
    return Verdict(node=node.name, status=broken)


class Decider:
    """Decides one node for one request under the cluster's rules and the node policy.

    With a ``ChoosingPolicy`` (``fgd``, ``gpushare``) the policy also picks the GPU inside the
    node, so the verdict, the score and the booking at bind all use its choice.
    """

    def __init__(self, rules: Rules, policy: NodePolicy) -> None:
        self.rules = rules
        self.policy = policy
        self.choosing = policy if isinstance(policy, ChoosingPolicy) else None

    @property
    def version(self) -> int:
        """Changes when remembered scores and GPU choices become stale."""
        return self.choosing.version if self.choosing is not None else 0

    @property
    def relative(self) -> bool:
        """Whether scores compare nodes within one call (normalised) rather than absolutely."""
        return self.choosing is not None and self.choosing.active

    def key(self, request: PodRequest) -> tuple[object, ...]:
        """The request as decisions are remembered: what the filter and the policy read from
        it (``shape_key``, plus the policy's ``reads``)."""
        if self.choosing is None:
            return shape_key(request)
        return (*shape_key(request), *self.choosing.reads(request))

    def decide(self, request: PodRequest, node: NodeInventory, usage: NodeUsage) -> Decision:
        """The verdict, with the policy's GPU choice where it makes one, and the score."""
        policy = self.choosing
        chooser: GpuChooser | None = None
        if policy is not None:

            def chooser(fitting: Sequence[Candidate]) -> tuple[int, ...]:
                return policy.choose(request, node, usage, fitting)

        verdict = with_handoff(request, node, usage, self.rules, chooser)
        if not verdict.fits:
            return verdict, 0.0
        return verdict, max(0.0, min(1.0, self.policy.score(request, node, usage, verdict.gpus)))
