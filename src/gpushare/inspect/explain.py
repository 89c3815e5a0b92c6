"""``kubectl inspect cgpu --explain``: would this pod fit each node now, and if not why (pure).

It runs the extender's own filter and scores (``gpushare.core.decision.scheduling``) over the ledger
rebuilt from pod annotations, so the answer is the one kube-scheduler would get from the
extender at this moment: per node a verdict with its reasons, and on nodes that fit the GPUs
the pod would get and how full they would be. A pod that already holds GPUs is judged with its
own share left out, as a re-bind would be. When no node fits, ``inspect.newnode`` says whether
a new node is asked for (a placeholder of the installed extender stands for the pod).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpushare.core.decision.clusterstate import ClusterState
from gpushare.core.decision.scheduling import Scheduler
from gpushare.core.model.kubejson import KubeObject, name_of, namespace_of, spec_of, status_of
from gpushare.core.model.requests import PodRequest, Rejection
from gpushare.core.model.status import Code
from gpushare.core.placement.explain import IN_CLUSTER, placement_message, refusal_summary
from gpushare.core.records.allocation import plan
from gpushare.inspect.newnode import PlaceholderSight, new_node_line
from gpushare.inspect.schema import ExplainDocument, NodeExplanationDoc, dump

OUTCOMES = {
    Code.SUCCESS: "yes",
    Code.UNSCHEDULABLE: "no",
    Code.WAIT: "no",
    Code.UNRESOLVABLE: "never",
}
"""``no``: it could fit once something is freed (or another pod has started); ``never``: not
on this node as it is."""


@dataclass(frozen=True)
class NodeExplanation:
    """One node's answer for the pod."""

    node: str
    fits: str
    gpus: tuple[int, ...] = ()
    score: int = 0
    reasons: tuple[str, ...] = ()
    placement: str = ""
    """On nodes that fit: where the pod would go and how full those GPUs would be."""


@dataclass(frozen=True)
class Explanation:
    """The what-if view of one pod."""

    namespace: str
    name: str
    phase: str
    bound_to: str
    asks: str
    nodes: tuple[NodeExplanation, ...]
    verdict: str
    """One line: the best node and its GPUs, or the refusals counted per reason."""
    rejection: tuple[str, ...] = ()
    new_node: str = ""
    """Whether it waits for a new node (``inspect.newnode``); empty when there is nothing
    to say."""


def _asks(request: PodRequest | Rejection, scheduler: Scheduler) -> str:
    if isinstance(request, Rejection):
        return "an invalid GPU request (see the reasons)"
    if not request.wants_gpu:
        return "no shared GPU memory: gpushare lets every node pass"
    unit = scheduler.settings.unit
    text = f"{unit.describe(request.mem_units)} GPU memory"
    if request.core_pct:
        text += f" and {request.core_pct}% computing power"
    if request.gpu_count > 1:
        held = request.mem_holding
        if len(set(held)) == 1:
            text += f" over {request.gpu_count} GPUs ({unit.describe(held[0])} each)"
        else:
            shares = ", ".join(unit.describe(h) for h in held)
            text += f" over {request.gpu_count} GPUs ({shares}: equal containers split alike)"
    return text


def explain_pod(
    pod: KubeObject,
    state: ClusterState,
    scheduler: Scheduler,
    *,
    placeholders: PlaceholderSight | None = None,
) -> Explanation:
    """Filter and score the pod on every node of the state, as the extender would now.

    With ``placeholders`` (the installed extender's, as listed), a pod no node fits is told
    whether one of them asks an autoscaler for a new node for it. The state's ledger
    is borrowed: a fitting node's placement is booked and given back at once to read how full
    its GPUs would be.
    """
    ledger = state.ledger
    nodes = sorted(state.nodes.values(), key=lambda n: n.name)
    result = scheduler.filter(pod, nodes, ledger)
    request = result.request
    scores = scheduler.prioritize(pod, nodes, ledger, request=request)
    by_name = {n.name: n for n in nodes}
    out = []
    for verdict in result.verdicts:
        node = by_name[verdict.node]
        placement = ""
        if verdict.fits and isinstance(request, PodRequest) and request.wants_gpu:
            allocation = plan(request, node=node.name, indexes=verdict.gpus, unit=node.unit)
            before = ledger.holding(request.uid) if request.uid else None
            was_assumed = bool(request.uid) and ledger.is_assumed(request.uid)
            ledger.assume(allocation)
            placement = placement_message(allocation, node, ledger.usage(node.name))
            ledger.unassume(request.uid)
            if was_assumed and before is not None:
                ledger.assume(before)
        out.append(
            NodeExplanation(
                node=verdict.node,
                fits=OUTCOMES[verdict.code],
                gpus=verdict.gpus,
                score=scores.get(verdict.node, 0) if verdict.fits else 0,
                reasons=verdict.reasons,
                placement=placement,
            )
        )
    fitting = [n for n in out if n.fits == "yes"]
    if fitting:
        best = min(
            fitting, key=lambda n: (-n.score, n.node)
        )  # kube-scheduler breaks ties at random
        verdict_line = (
            f"{len(fitting)}/{len(out)} {IN_CLUSTER}; best score {best.score}: "
            f"{best.placement or best.node}"
        )
    else:
        verdict_line = refusal_summary(["; ".join(n.reasons) for n in out], len(out), IN_CLUSTER)
    return Explanation(
        namespace=namespace_of(pod),
        name=name_of(pod),
        phase=str(status_of(pod).get("phase") or "Pending"),
        bound_to=str(spec_of(pod).get("nodeName") or ""),
        asks=_asks(request, scheduler),
        nodes=tuple(out),
        verdict=verdict_line,
        rejection=request.reasons if isinstance(request, Rejection) else (),
        new_node=new_node_line(
            pod,
            fits_somewhere=bool(fitting),
            wants_gpu=isinstance(request, PodRequest) and request.wants_gpu,
            sight=placeholders,
            names=scheduler.settings.names,
        ),
    )


def explanation_json(explanation: Explanation) -> dict[str, Any]:
    """The explanation as plain JSON (``--explain -o json``; ``inspect.schema``)."""
    e = explanation
    document = ExplainDocument(
        namespace=e.namespace,
        name=e.name,
        phase=e.phase,
        bound_to=e.bound_to,
        asks=e.asks,
        nodes=[
            NodeExplanationDoc(
                node=n.node,
                fits=n.fits,  # type: ignore[arg-type]  # an OUTCOMES value, checked by the model
                gpus=list(n.gpus),
                score=n.score,
                reasons=list(n.reasons),
                placement=n.placement,
            )
            for n in e.nodes
        ],
        verdict=e.verdict,
        rejection=list(e.rejection),
        new_node=e.new_node,
    )
    return dump(document)
