"""Text rendering of the inspect view, in the layout the seed documents show.

Summary, byte for byte as seed 001 prints it::

    NAME                       IPADDRESS      GPU0(Allocated/Total)  GPU Memory(GiB)
    cn-shanghai.192.168.6.104  192.168.6.104  0/15                   0/15
    ----------------------------------------------------------------------
    Allocated/Total GPU Memory In Cluster:
    0/15 (0%)

Columns are padded to their widest cell and separated by two spaces. The dashed line is not as
wide as the table: ACK's plugin sizes it from the first node's row as written before alignment
(its cells, each followed by one separator character) plus 20, which is 70 in seed 001 and 75
in seed 000, 10 less than the header there; ``rule_width`` does the same, so the output is the
seeds' text for the seeds' clusters. Amounts are in GiB when
every node counts 1 GiB units, otherwise in MiB (the header says which). A ``PENDING(Allocated)``
column appears when some pod holds memory on an unknown GPU. Percentages are truncated.
A GPU the operator took out of service (``gpushare.io/gpus-disabled``) has a ``*`` after its
cell and a note after the cluster line. In ``-d``, a ``POLICY(UNIT)`` column names the
ResourcePolicy and unit each pod was placed in, when some pod was (none in the seeds).
Allocations gpushare ignores (core.records.trust) follow, one per
pod, with why, and
then a note naming the nodes that have GPU memory but no sharing mode label (none in the seeds,
so their text is unchanged).

A narrowed or partial view (``inspect.scope``: ``-n``, ``-l``, or a reader who may not list
nodes or every namespace's pods) says so: its total line is not the cluster's, and notes name
what could not be read; a GPU of a node known only from its pods that none of them holds is
``?``. ``Layout`` carries kubectl's ``--no-headers`` and ``-o wide`` (``MODE`` and ``PODS``
after the summary's columns); the default layout is the seeds'.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpushare.core.model.inventory import Mode
from gpushare.core.model.names import ANN_DEV, ANN_NODE_GPUS_DISABLED, LABEL_MODE
from gpushare.core.records.gpuuse import UsedSummary
from gpushare.inspect.explain import Explanation
from gpushare.inspect.view import ClusterView, NodeView

OUT_OF_SERVICE_MARK = "*"
"""Follows a GPU's cell when the operator took it out of service (``core.model.disabling``)."""

MIN_RULE = 75
"""Width of the dashed line between nodes in ``-d`` (no seed shows that layout)."""

RULE_EXTRA = 20
"""What ACK's plugin adds to the first node row's unaligned length for the summary's line."""

UNKNOWN = "?"
"""A GPU cell the reader cannot know (a node read from its pods, a GPU none of them holds)."""


@dataclass(frozen=True)
class Layout:
    """kubectl's table options; the default is the seeds' layout."""

    headers: bool = True
    """False: ``--no-headers``, tables start with their first row."""
    wide: bool = False
    """``-o wide``: the summary adds each node's mode and its number of pods shown."""


def rule_width(first_row: Sequence[str]) -> int:
    """Dashes under the summary table: the first node row unaligned (cells and one separator
    after each) plus ``RULE_EXTRA``; no row, no dashes, as the plugin prints an empty line."""
    if not first_row:
        return 0
    return sum(len(cell) + 1 for cell in first_row) + RULE_EXTRA


def _table(rows: Sequence[Sequence[str]], *, headers: bool = True) -> list[str]:
    if not headers:
        rows = rows[1:]
    if not rows:
        return []
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])] + [row[-1]]
        lines.append("  ".join(cells).rstrip())
    return lines


def _pct(part: int, whole: int) -> int:
    return part * 100 // whole if whole else 0


class _Amounts:
    """Formats amounts in GiB when all nodes use 1 GiB units, else in MiB."""

    def __init__(self, view: ClusterView) -> None:
        self.mib = any(n.unit_mib != 1024 for n in view.nodes)
        self.label = "MiB" if self.mib else "GiB"

    def of(self, node: NodeView, units: int) -> str:
        return str(units * node.unit_mib if self.mib else units)

    def cluster(self, mib: int) -> str:
        return str(mib if self.mib else mib // 1024)


def render_summary(view: ClusterView, layout: Layout = Layout()) -> str:
    """The default ``kubectl inspect cgpu`` table."""
    amounts = _Amounts(view)
    width = max((_columns(n) for n in view.nodes), default=0)
    pending = any(n.pending_units for n in view.nodes)
    header = ["NAME", "IPADDRESS"] + [f"GPU{i}(Allocated/Total)" for i in range(width)]
    if pending:
        header.append("PENDING(Allocated)")
    header.append(f"GPU Memory({amounts.label})")
    if layout.wide:
        header += ["MODE", "PODS"]
    rows = [header]
    for node in view.nodes:
        by_index = {g.index: g for g in node.gpus}
        row = [node.name, node.ip or "-"]
        for i in range(width):
            gpu = by_index.get(i)
            row.append(
                f"{amounts.of(node, gpu.allocated_units)}/{amounts.of(node, gpu.total_units)}"
                f"{OUT_OF_SERVICE_MARK if gpu.out_of_service else ''}"
                if gpu
                else (UNKNOWN if node.seen_from_pods else "-")
            )
        if pending:
            row.append(amounts.of(node, node.pending_units) if node.pending_units else "0")
        row.append(f"{amounts.of(node, node.allocated_units)}/{amounts.of(node, node.total_units)}")
        if layout.wide:
            row += [_mode(node), str(len(node.pods))]
        rows.append(row)
    lines = _table(rows, headers=layout.headers)
    rule = "-" * rule_width(rows[1][: len(rows[1]) - 2 * layout.wide] if len(rows) > 1 else ())
    tail = [
        *_cluster_lines(view, amounts),
        *_out_of_service_lines(view),
        *_ignored_lines(view),
        *_unlabelled_lines(view),
        *_scope_lines(view),
    ]
    return "\n".join([*lines, rule, *tail]) + "\n"


def _out_of_service_lines(view: ClusterView) -> list[str]:
    off = [
        f"{node.name} GPU{g.index}" for node in view.nodes for g in node.gpus if g.out_of_service
    ]
    if not off:
        return []
    return [
        f"Note: {OUT_OF_SERVICE_MARK} marks a GPU out of service ({ANN_NODE_GPUS_DISABLED}): "
        f"{', '.join(off)}.",
        "Pods on it keep running; no new pod is placed there until the annotation is removed.",
    ]


def _unlabelled_lines(view: ClusterView) -> list[str]:
    if not view.unlabelled:
        return []
    names = ", ".join(view.unlabelled)
    first = view.unlabelled[0]
    return [
        f"Note: node(s) {names} have GPU memory but no {LABEL_MODE} label gpushare knows, so no",
        "GPU-sharing pod is placed there. Label each one, for example:",
        f"  kubectl label node {first} {LABEL_MODE}=share   # or cgpu, core_mem, mps",
    ]


def _ignored_lines(view: ClusterView) -> list[str]:
    if not view.ignored:
        return []
    return [
        "Ignored allocations (not written by gpushare for their pod; they hold nothing):",
        *(f"{i.namespace}/{i.name} names node {i.node}: {i.reason}" for i in view.ignored),
    ]


def _columns(node: NodeView) -> int:
    """GPU columns the node needs: its GPUs, or up to the highest index its pods name."""
    if node.seen_from_pods:
        return max((g.index + 1 for g in node.gpus), default=0)
    return len(node.gpus)


def _mode(node: NodeView) -> str:
    return "unknown" if node.seen_from_pods else node.mode.value


def _scope_lines(view: ClusterView) -> list[str]:
    """What the view leaves out by choice, and what the reader could not see."""
    out = []
    scope, sight = view.scope, view.sight
    if scope.narrowed and (scope.selector.requirements or not sight.pods_namespace):
        where = f"namespace {scope.namespace}" if scope.namespace else "all namespaces"
        match = f" matching {scope.selector.text}" if scope.selector.requirements else ""
        out.append(f"Shown: the pods of {where}{match}, and the nodes they are on.")
    if sight.pods_namespace:
        ns = sight.pods_namespace
        out.append(
            f"Note: pods outside namespace {ns}: forbidden; showing only namespace {ns}'s pods, "
            f"and Allocated counts only theirs."
        )
    if not sight.nodes:
        out.append(
            f"Note: nodes: forbidden; each node is what its pods' allocations say: the GPUs they "
            f"hold ({UNKNOWN}: others), sized by {ANN_DEV}."
        )
    if not sight.slices:
        out.append(
            "Note: resourceslices: forbidden; each DRA node is what its claims hold: the GPUs "
            "they name, each as large as the most held on it."
        )
    if not sight.claims:
        out.append(
            "Note: resourceclaims: forbidden; DRA nodes show no holdings (ask for get/list on "
            "resourceclaims beside pods)."
        )
    return out


def _cluster_lines(view: ClusterView, amounts: _Amounts) -> list[str]:
    total, allocated = view.total_mib(), view.allocated_mib()
    where = "In Cluster" if view.whole else "On The Nodes Shown"
    return [
        f"Allocated/Total GPU Memory {where}{'' if not amounts.mib else ' (MiB)'}:",
        f"{amounts.cluster(allocated)}/{amounts.cluster(total)} ({_pct(allocated, total)}%)",
    ]


def _used_line(node: NodeView, used: UsedSummary, amounts: _Amounts) -> str:
    """GPU memory in use beside allocated, per GPU, from the device plugin's summary."""
    label = amounts.label
    parts = []
    for gpu in node.gpus:
        mib = used.on(gpu.index)
        held = "?" if mib is None else (str(mib) if amounts.mib else f"{mib / 1024:.1f}")
        parts.append(f"GPU{gpu.index} {held}/{amounts.of(node, gpu.allocated_units)}")
    return f"Used :       {', '.join(parts)} {label} in use/allocated (as of {used.at})"


def render_details(view: ClusterView, layout: Layout = Layout()) -> str:
    """``kubectl inspect cgpu -d``: per node, its pods and what each holds per GPU."""
    amounts = _Amounts(view)
    out: list[str] = []
    for node in view.nodes:
        core = node.mode is Mode.CORE_MEM
        out += [
            f"NAME:       {node.name}",
            f"IPADDRESS:  {node.ip or '-'}",
            f"MODE:       {_mode(node)}",
        ]
        if node.problem:
            out.append(f"PROBLEM:    {node.problem}")
        out.append("")
        indexes = [g.index for g in node.gpus]
        off = {g.index for g in node.gpus if g.out_of_service}
        header = ["NAME", "NAMESPACE"] + [
            f"GPU{i}(Allocated){OUT_OF_SERVICE_MARK if i in off else ''}" for i in indexes
        ]
        if core:
            header += [f"GPU{i}(Core%)" for i in indexes]
        if node.pending_units:
            header.append("PENDING(Allocated)")
        header.append("STATE")
        if view.has_policies:
            header.append("POLICY(UNIT)")
        rows = [header]
        for pod in node.pods:
            row = [pod.name, pod.namespace]
            row += [amounts.of(node, pod.mem_units.get(i, 0)) for i in indexes]
            if core:
                row += [str(pod.core_pct.get(i, 0)) for i in indexes]
            if node.pending_units:
                row.append(amounts.of(node, pod.pending_units))
            row.append(pod.state)
            if view.has_policies:
                row.append(f"{pod.policy}({pod.unit})" if pod.unit else "-")
            rows.append(row)
        out += _table(rows, headers=layout.headers)
        allocated, total = node.allocated_units, node.total_units
        out.append(f"Allocated :  {amounts.of(node, allocated)} ({_pct(allocated, total)}%)")
        out.append(f"Total :      {amounts.of(node, total)}")
        if core:
            out.append(
                f"Core :       {node.core_allocated_pct}/{node.core_capacity_pct}% "
                f"({_pct(node.core_allocated_pct, node.core_capacity_pct)}%)"
            )
        if node.used is not None:
            out.append(_used_line(node, node.used, amounts))
        out.append("-" * MIN_RULE)
        out.append("")
    out += _cluster_lines(view, amounts)
    out += _out_of_service_lines(view)
    out += _ignored_lines(view)
    out += _unlabelled_lines(view)
    out += _scope_lines(view)
    return "\n".join(out) + "\n"


def render_explanation(explanation: Explanation, layout: Layout = Layout()) -> str:
    """``kubectl inspect cgpu --explain``: the pod, then per node whether it fits and why not."""
    e = explanation
    where = f", bound to {e.bound_to}" if e.bound_to else ""
    out = [
        f"POD:      {e.namespace}/{e.name} ({e.phase}{where})",
        f"ASKS:     {e.asks}",
    ]
    out += [f"INVALID:  {reason}" for reason in e.rejection]
    out.append(f"VERDICT:  {e.verdict}")
    if e.new_node:
        out.append(f"NEW NODE: {e.new_node}")
    out.append("")
    rows = [["NODE", "FITS", "GPUS", "SCORE", "WHY / WOULD GET"]]
    for node in e.nodes:
        gpus = "+".join(f"GPU{i}" for i in node.gpus) or "-"
        why = node.placement if node.fits == "yes" else "; ".join(node.reasons)
        score = str(node.score) if node.fits == "yes" else "-"
        rows.append([node.node, node.fits, gpus, score, why or "-"])
    out += _table(rows, headers=layout.headers)
    if not e.nodes:
        out.append("(no nodes)")
    out += [
        "",
        "FITS: yes = fits now; no = could fit once GPU memory, computing power or a waiting pod",
        "frees up; never = not on this node as it is (mode, size, unit, invalid request).",
    ]
    return "\n".join(out) + "\n"
