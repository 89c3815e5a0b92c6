"""Filter: can this pod's request be placed on this node, and if not, why.

Outcomes follow the kube-scheduler framework, as a ``Status`` (``core.model.status``):
``SUCCESS``, ``UNSCHEDULABLE`` (could fit once something is freed) and ``UNRESOLVABLE`` (never
on this node as it is: wrong mode, unit or size, so preemption would not help). Every failure
carries reasons a person can act on, such as ``GPU0: 2/15 GiB free < 3 GiB requested``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpushare.core.booking.ledger import NOTHING, GpuUsage, NodeUsage
from gpushare.core.model.inventory import CORE_PER_GPU, Gpu, Mode, NodeInventory, Placement
from gpushare.core.model.names import ANN_NODE_GPUS_DISABLED, LABEL_MODE, LABEL_POD_GPU_COUNT
from gpushare.core.model.requests import PodRequest
from gpushare.core.model.status import SUCCESS, Code, Status
from gpushare.core.model.topology import closest_set
from gpushare.core.model.units import MemoryUnit
from gpushare.core.placement.placing import Candidate, choose_gpus, rank_gpus

SOURCE = "gpushare"
"""Who the filter's statuses say decided."""


@dataclass(frozen=True)
class Verdict:
    """A node's answer for one pod, with the GPUs it would use when it fits."""

    node: str
    status: Status = SUCCESS
    gpus: tuple[int, ...] = ()

    @property
    def fits(self) -> bool:
        """Whether the pod can be placed on this node now."""
        return self.status.is_success

    @property
    def code(self) -> Code:
        """The status's code."""
        return self.status.code

    @property
    def reasons(self) -> tuple[str, ...]:
        """The status's reasons."""
        return self.status.reasons

    @property
    def message(self) -> str:
        """All reasons in one line (the extender sends it for every failing node)."""
        return self.status.message


def refusal(node: str, code: Code, reasons: Sequence[str]) -> Verdict:
    """The filter's verdict that the pod does not go to ``node``, with why."""
    return Verdict(node=node, status=Status(code, tuple(reasons), SOURCE))


@dataclass(frozen=True)
class Rules:
    """Cluster-wide settings the filter applies."""

    cluster_unit: MemoryUnit = MemoryUnit.GiB
    max_pods_per_gpu: int | None = None
    """Pods per GPU under isolation; None takes the seed's 20 (16 at the 128 MiB unit)."""

    def pod_limit(self, unit: MemoryUnit) -> int:
        """The per-GPU pod limit at a unit."""
        return self.max_pods_per_gpu or unit.default_max_pods_per_gpu


def _node_rules(request: PodRequest, node: NodeInventory, rules: Rules) -> str | None:
    """The reason the node can never take the pod; None when its rules allow it."""
    if node.problem:
        return node.problem
    if node.mode is Mode.NONE:
        return (
            f"node is not shared: label {LABEL_MODE} must be share, cgpu, core_mem or mps to place "
            f"pods that ask for GPU memory"
        )
    if node.unit_declared and node.unit is not rules.cluster_unit:
        return (
            f"node advertises GPU memory in {node.unit.value} units but the scheduler counts "
            f"{rules.cluster_unit.value}; set gpuMemoryUnit the same everywhere"
        )
    if request.wants_core and node.mode is not Mode.CORE_MEM:
        return (
            f"pod asks for {request.core_pct}% computing power but node mode is "
            f"{node.mode.value}; only {LABEL_MODE}=core_mem nodes share computing power"
        )
    if not request.wants_core and node.mode is Mode.CORE_MEM:
        return (
            "node is core_mem and takes only pods that also ask for computing power "
            "(memory-only and memory+core pods never share a node)"
        )
    if node.mode is Mode.MPS and request.gpu_count > 1:
        return (
            f"pod needs {request.gpu_count} GPUs ({LABEL_POD_GPU_COUNT}) but node mode is mps: "
            f"an MPS client reaches one per-GPU control daemon, so mps nodes serve one GPU a pod"
        )
    if len(node.gpus) < request.gpu_count:
        return (
            f"pod needs {request.gpu_count} GPUs ({LABEL_POD_GPU_COUNT}) but node has "
            f"{len(node.gpus)}"
        )
    return None


def _miss_reasons(
    misses: Sequence[tuple[Gpu, GpuUsage]], request: PodRequest, node: NodeInventory, limit: int
) -> list[str]:
    """Why each GPU that cannot take the pod does not, in GPU order (``filter_node``)."""
    unit = node.unit
    want = request.mem_per_gpu
    want_core = request.core_per_gpu
    reasons: list[str] = []
    for gpu, held in misses:
        label = f"GPU{gpu.index}"
        free = gpu.mem_units - held.mem_units
        if gpu.mem_units < want:
            reasons.append(
                f"{label}: {unit.describe(gpu.mem_units)} total < {unit.describe(want)} requested"
            )
        elif not gpu.healthy:
            reasons.append(f"{label}: unhealthy")
        elif gpu.disabled:
            reasons.append(f"{label}: out of service ({ANN_NODE_GPUS_DISABLED} on the node)")
        elif free < want:
            reasons.append(
                f"{label}: {unit.describe_ratio(free, gpu.mem_units)} free < "
                f"{unit.describe(want)} requested"
            )
        elif node.mode is Mode.CORE_MEM and CORE_PER_GPU - held.core_pct < want_core:
            reasons.append(
                f"{label}: {CORE_PER_GPU - held.core_pct}/{CORE_PER_GPU}% computing power free "
                f"< {want_core}% requested"
            )
        else:
            reasons.append(f"{label}: {held.pods}/{limit} pods, the isolation limit per GPU")
    return reasons


GpuChooser = Callable[[Sequence[Candidate]], tuple[int, ...]]
"""Picks GPUs among the fitting ones (a policy's choice); () leaves it to the placement."""


def filter_node(
    request: PodRequest,
    node: NodeInventory,
    usage: NodeUsage,
    *,
    rules: Rules,
    prefer: tuple[int, ...] = (),
    chooser: GpuChooser | None = None,
) -> Verdict:
    """Decide whether the pod fits on the node now, choosing its GPUs if it does.

    ``chooser`` replaces best fit on ``binpack`` nodes when nothing is preferred; a node
    labelled ``spread`` keeps its most-free choice, and the hand-off's preference comes first.
    A multi-GPU pod on a node that publishes its topology gets the best-connected set, ties
    going to that choice.
    """
    never = _node_rules(request, node, rules)
    if never is not None:
        return refusal(node.name, Code.UNRESOLVABLE, (never,))
    unit = node.unit
    want = request.mem_per_gpu
    want_core = request.core_per_gpu
    limit = rules.pod_limit(unit)
    check_core = node.mode is Mode.CORE_MEM
    check_pods = node.mode.isolated
    big_enough = 0
    fitting: list[Candidate] = []
    misses: list[tuple[Gpu, GpuUsage]] = []
    """GPUs that cannot take the pod: their reasons are written only if the node fails."""
    for gpu in node.gpus:
        if gpu.mem_units < want:
            misses.append((gpu, NOTHING))
            continue
        big_enough += 1
        held = usage.on(gpu.index)
        if (
            gpu.healthy
            and not gpu.disabled
            and gpu.mem_units - held.mem_units >= want
            and not (check_core and CORE_PER_GPU - held.core_pct < want_core)
            and not (check_pods and held.pods >= limit)
        ):
            free = gpu.mem_units - held.mem_units
            fitting.append(
                Candidate(gpu.index, free - want, CORE_PER_GPU - held.core_pct - want_core)
            )
        else:
            misses.append((gpu, held))
    if big_enough < request.gpu_count:
        reasons = _miss_reasons(misses, request, node, limit)
        return refusal(node.name, Code.UNRESOLVABLE, reasons)
    if len(fitting) < request.gpu_count:
        reasons = _miss_reasons(misses, request, node, limit)
        if request.gpu_count > 1:
            reasons.insert(0, f"{len(fitting)} of {request.gpu_count} GPUs needed have room")
        return refusal(node.name, Code.UNSCHEDULABLE, reasons)
    if usage.unplaced_mem_units:
        free_total = node.mem_units_total - usage.mem_units
        if free_total < request.mem_units:
            return refusal(
                node.name,
                Code.UNSCHEDULABLE,
                (
                    f"node: {unit.describe_ratio(free_total, node.mem_units_total)} free < "
                    f"{unit.describe(request.mem_units)} requested ("
                    f"{unit.describe(usage.unplaced_mem_units)} held by pods on unknown GPUs)",
                ),
            )
    kubelet = node.kubelet_mem_units
    if kubelet == 0 and node.mem_units_total:
        return refusal(
            node.name,
            Code.UNSCHEDULABLE,
            (
                "node: its device plugin is not serving: kubelet allocates none of the node's "
                f"{unit.describe(node.mem_units_total)} GPU memory (the plugin is restarting "
                "or not registered yet, or every device is unhealthy); kubelet would refuse "
                "the pod at admission",
            ),
        )
    if (
        kubelet is not None
        and kubelet < node.mem_units_total
        and usage.mem_units + request.mem_units > kubelet
    ):
        return refusal(
            node.name,
            Code.UNSCHEDULABLE,
            (
                f"node: kubelet allocates only {unit.describe(kubelet)} of the node's "
                f"{unit.describe(node.mem_units_total)} GPU memory and "
                f"{unit.describe(usage.mem_units)} is held, < {unit.describe(request.mem_units)} "
                "requested (the device plugin is not registered with kubelet yet, or some of "
                "its devices are unhealthy)",
            ),
        )
    chosen: tuple[int, ...] = ()
    if chooser is not None and not prefer and node.placement is Placement.BINPACK:
        chosen = chooser(fitting)
    if node.distance and request.gpu_count > 1 and not prefer:
        # the policy's (or placement's) choice ranks first, so it stands when no set of GPUs
        # is better connected (core.model.topology)
        ranked = rank_gpus(fitting, node.placement, chosen)
        chosen = closest_set(ranked, request.gpu_count, node.distance, node.position)
    return Verdict(
        node=node.name,
        gpus=chosen or choose_gpus(fitting, request.gpu_count, node.placement, prefer),
    )
