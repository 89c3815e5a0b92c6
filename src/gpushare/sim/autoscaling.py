"""The autoscaling protocol: nodes are bought when a pod fits none and sold when one stays empty.

The churn protocol (``sim.churn``) keeps the trace's 1,213 nodes and counts idle GPUs. A cluster
whose GPU pools scale pays for nodes instead, so here the same pods and the same placement
policies run on a cluster that starts with **no node** (every group's minimum is 0, as
cluster-autoscaler's kwok groups default to) and grows and shrinks as the autoscaler would,
and the bill is counted in node-hours and GPU-hours provisioned.

*Node groups.* One per distinct node shape of the trace (GPUs, GPU model and memory, CPU, host
memory: 15 on openb), each at most ``headroom`` x as many nodes as the trace has of it (rounded
up): a node group has a maximum size, and the trace's own counts say how many of each shape a
provider offered. A group at its maximum takes no more nodes; the pods it would have taken go
to another group or wait for room; a run counts the loops where that happened
(``refused_at_max``).

*Demand.* The churn protocol's pods (the seed's stream, each running its own time in the
trace), arriving at times that do not depend on the policy: the churn protocol's rule (the next
pod arrives whenever the GPUs asked for fall below ``load`` x the trace cluster's capacity)
played on a cluster where every pod starts at once. So every policy sees the same pods at the
same moments, and the measure runs over the same span: from 0 to the last arrival. A pod that
waits for a node starts, and so leaves, later.

*Scale-up*, as cluster-autoscaler 1.36.1 does it with gpushare's placeholder pods
(``../shared/docs/AUTOSCALERS.md`` 1a, 1d). The autoscaler runs a loop every ``scan_s``
(10 s, its ``--scan-interval`` default). A pod counts for scale-up when it fits no ready node
GPU by GPU: stock cluster-autoscaler judges ``aliyun.com/gpu-mem`` by node totals and would
call a pod "schedulable" beside four GPUs of 3 GiB free (the fragmentation trap); gpushare's
placeholder pods (one per virtual GPU, ``aliyun.com/gpu-count: 1``, refused on every existing
node by hostname) make it see the pod GPU by GPU, and that is what is simulated here. Pending
pods that fit a node already being provisioned (packed onto the upcoming nodes first fit,
oldest pod first, as cluster-autoscaler injects upcoming nodes into its snapshot) ask for
nothing more. For the rest, each group's estimate packs them onto fresh template nodes, pods in
decreasing CPU/node CPU + memory/node memory (the binpacking estimator's
``DecreasingPodOrderer``), each onto the first new node that fits it GPU by GPU, else a new
node. The expander is **least-waste**, cluster-autoscaler's default (``--expander``,
``config/flags/flags.go``): the group whose new nodes leave the least wasted CPU share plus
wasted memory share for the pods they take (``expander/waste/waste.go``). Its equal scores are
broken by the least wasted GPU share (our addition: GPUs are what these nodes cost), then by the
group with more nodes in the trace. One group is expanded per loop; the pods it does not take
ask again at the next loop. New nodes cost from the moment they are asked for and take
``provision_s`` to become ready (3 minutes by default: launch, boot, kubelet and the device
plugin publishing ``aliyun.com/gpu-mem``; the startup taint keeps pods off until then, so no
second scale-up follows a node that registers early). Pods that fit no group at all wait for
ever (``unplaceable``). Least-waste rather than the others cluster-autoscaler offers: it is
the default, so what an operator gets without choosing; ``random`` would add noise that has
nothing to do with placement, ``price`` needs prices the trace does not have, and
``priority`` an order someone must write. A loop with nothing new (the same pods waiting, the
same nodes on their way and no group freed) gives the same answer and is skipped.
Karpenter (``sigs.k8s.io/karpenter`` v1.15.0) is not modelled: it packs by node totals too
(AUTOSCALERS.md 1c), but picks instance types and consolidates by its own rules.

*Placement.* Every arriving pod, and every waiting pod when something frees or a node becomes
ready, is placed by the policy among the ready nodes it fits, through the same ports as the
churn protocol (``milligpu.Cluster.feasible``, ``PlacementPolicy.choose``, ``Cluster.place``):
the same core code. A node not yet bought, or sold, is a slot of the cluster with no CPU, no
memory and no GPU, so no policy, cache or scarce-shape supply counts it.

*Scale-down*, as cluster-autoscaler's defaults do it for GPU nodes with gpushare's guard: a node
is removed only when no pod runs on it and it has stayed so for ``unneeded_s`` (10 minutes,
``--scale-down-unneeded-time``); never a node that holds a pod (gpushare's scale-down guard
marks share nodes that hold pods it cannot place again GPU by GPU; this protocol keeps the
simpler rule of empty nodes only). No node is removed for ``delay_after_add_s`` after a
scale-up (10 minutes, ``--scale-down-delay-after-add``); the empty time still counts during that
pause. At most ``max_delete`` nodes go per loop (10, ``--max-scale-down-parallelism``).

*Measured* from 0 to the last arrival: node-hours and GPU-hours provisioned (nodes asked for
and not yet removed), GPU-hours held by pods and the share of the provisioned ones they are,
the GPU demand that waited (GPU-hours), how many pods waited and how long, the most nodes at
once, scale-ups and nodes removed.
"""

from __future__ import annotations

import heapq
import math
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from gpushare.sim.churn import HOUR, MIN_RUN_S, remove
from gpushare.sim.milligpu import BoolArray, Cluster, PlacementPolicy, make_policy
from gpushare.sim.openb import MILLI_PER_GPU, TraceNode, TracePod
from gpushare.sim.stream import arrival_stream, capacity_milli

LOAD = 0.25
"""GPU demand kept present, share of the trace cluster's GPU capacity: about 1,550 GPUs on
openb, 450 to 670 nodes at the peak. A quarter rather than the churn protocol's 95 % keeps a
seed of gpushare under a minute on one core (at 95 % it takes several); a cluster that scales
has no fixed size to fill."""

VOLUME = 1.0
"""GPU demand of the whole stream, in capacities of the trace cluster: at ``LOAD`` four times
the demand present, a span of about an hour on openb, several of the autoscaler's 10-minute
timers (the churn protocol's stream at 95 % gives a quarter of an hour)."""

SERIES = 240
"""Points of the node-count-over-time series kept per run."""


@dataclass(frozen=True)
class Settings:
    """The autoscaler's timers and limits; defaults are cluster-autoscaler 1.36.1's."""

    provision_s: float = 180.0
    """From the scale-up to the node ready with its GPUs published."""
    unneeded_s: float = 600.0
    """``--scale-down-unneeded-time``: how long a node stays empty before it goes."""
    delay_after_add_s: float = 600.0
    """``--scale-down-delay-after-add``: no scale-down this long after a scale-up."""
    scan_s: float = 10.0
    """``--scan-interval``: the autoscaler's loop."""
    max_delete: int = 10
    """``--max-scale-down-parallelism``: nodes removed at most per loop."""
    headroom: float = 2.0
    """Each group's maximum, in multiples of the trace's nodes of that shape."""

    def __post_init__(self) -> None:
        for name in ("provision_s", "unneeded_s", "delay_after_add_s"):
            value = getattr(self, name)
            if not value >= 0:
                raise ValueError(f"{name}={value!r} must be 0 or more seconds")
        if not self.scan_s > 0:
            raise ValueError(f"scan_s={self.scan_s!r} must be more than 0 seconds")
        if self.max_delete < 1:
            raise ValueError(f"max_delete={self.max_delete!r} must be 1 or more")
        if not self.headroom > 0:
            raise ValueError(f"headroom={self.headroom!r} must be more than 0 (1 = the trace's)")


@dataclass(frozen=True)
class NodeGroup:
    """One node shape of the trace, as a group the autoscaler can grow."""

    name: str
    template: TraceNode
    in_trace: int
    """Nodes of this shape in the trace."""
    max_size: int


def node_groups(nodes: Sequence[TraceNode], headroom: float = 2.0) -> list[NodeGroup]:
    """One group per distinct shape, the most common first (ties by name)."""
    counts: Counter[tuple[int, str, int, int, int]] = Counter(
        (n.gpus, n.model, n.gpu_mem_mib, n.cpu_milli, n.memory_mib) for n in nodes
    )
    groups = []
    for (gpus, model, gpu_mem, cpu, mem), count in counts.items():
        name = f"{gpus}x{model or 'none'}-{cpu // 1000}c-{mem // 1024}g"
        if gpu_mem:
            name += f"-{gpu_mem}m"
        template = TraceNode(name, cpu, mem, gpus, model, gpu_mem_mib=gpu_mem)
        groups.append(NodeGroup(name, template, count, max(1, math.ceil(headroom * count))))
    groups.sort(key=lambda g: (-g.in_trace, g.name))
    return groups


def arrival_times(stream: Sequence[TracePod], target_milli: float) -> list[float]:
    """When each pod of the stream arrives: the churn rule on a cluster where none waits.

    The next pod arrives whenever the GPUs asked for by running pods fall below the target;
    each runs its own time (at least ``MIN_RUN_S``).
    """
    running: list[tuple[float, int]] = []  # (end, milli-GPU)
    present = 0
    clock = 0.0
    times = []
    for pod in stream:
        while present >= target_milli and running:
            clock, milli = heapq.heappop(running)
            present -= milli
        times.append(clock)
        present += pod.gpu_request_milli
        heapq.heappush(running, (clock + max(MIN_RUN_S, pod.duration_s), pod.gpu_request_milli))
    return times


@dataclass
class AutoscaleRun:
    """One policy on one seed of the autoscaling protocol."""

    policy: str
    seed: int
    node_hours: float = 0.0
    gpu_hours: float = 0.0
    """GPU-hours provisioned (every GPU of every node bought and not yet removed)."""
    held_gpu_hours: float = 0.0
    """GPU-hours the pods held."""
    waited_gpu_hours: float = 0.0
    waited_pods: int = 0
    mean_wait_min: float = 0.0
    longest_wait_min: float = 0.0
    peak_nodes: int = 0
    scale_ups: int = 0
    nodes_added: int = 0
    nodes_removed: int = 0
    refused_at_max: int = 0
    """Loops (those with something new) where a group whose empty node fits a pending pod was
    at its maximum size."""
    unplaceable: int = 0
    """Pods that fit no group's empty node (they wait for ever)."""
    arrived: int = 0
    span_h: float = 0.0
    seconds: float = 0.0
    groups: dict[str, float] = field(default_factory=dict)
    """Node-hours per group."""
    series: list[tuple[float, int]] = field(default_factory=list)
    """(hours, nodes bought) on ``SERIES`` evenly spaced points of the span."""

    @property
    def used_pct(self) -> float:
        """GPU-hours held, % of those provisioned."""
        return 100.0 * self.held_gpu_hours / self.gpu_hours if self.gpu_hours else math.nan


CLOSED, PROVISIONING, READY = 0, 1, 2


class Pool:
    """Every node the groups may ever have, as slots of one ``milligpu.Cluster``.

    A slot not bought (or sold) has no CPU, memory or GPU, so ``feasible`` refuses it for any
    pod that asks for something and the policies' caches see it change like any node (its
    version moves). ``ready`` masks out the slots that are not ready for the pods that ask for
    nothing.
    """

    def __init__(self, groups: Sequence[NodeGroup], seed: int) -> None:
        self.groups = list(groups)
        slots = [
            TraceNode(
                f"{g.name}-{k}",
                g.template.cpu_milli,
                g.template.memory_mib,
                g.template.gpus,
                g.template.model,
                gpu_mem_mib=g.template.gpu_mem_mib,
            )
            for g in self.groups
            for k in range(g.max_size)
        ]
        self.cluster = Cluster(slots, seed=seed)
        self.group_of = np.array(
            [k for k, g in enumerate(self.groups) for _ in range(g.max_size)], dtype=np.int64
        )
        self.state = np.full(len(slots), CLOSED, dtype=np.int64)
        self.ready: BoolArray = np.zeros(len(slots), dtype=np.bool_)
        self.pods = np.zeros(len(slots), dtype=np.int64)
        for i in range(len(slots)):
            self._empty(i)

    def _empty(self, i: int) -> None:
        c = self.cluster
        c.cpu[i] = 0
        c.mem[i] = 0
        c.gpus[i] = 0
        c.free[i, :] = -1
        c.version[i] += 1

    def open(self, group: int, count: int) -> list[int]:
        """Buy ``count`` nodes of the group (as many as its maximum leaves): their slots."""
        free = np.flatnonzero((self.group_of == group) & (self.state == CLOSED))[:count]
        self.state[free] = PROVISIONING
        return [int(i) for i in free]

    def make_ready(self, i: int) -> None:
        node = self.cluster.nodes[i]
        c = self.cluster
        c.cpu[i] = node.cpu_milli
        c.mem[i] = node.memory_mib
        c.gpus[i] = node.gpus
        c.free[i, : node.gpus] = MILLI_PER_GPU
        c.version[i] += 1
        self.state[i] = READY
        self.ready[i] = True

    def close(self, i: int) -> None:
        if self.pods[i]:
            raise RuntimeError(f"slot {i} holds {self.pods[i]} pod(s); only empty nodes go")
        self._empty(i)
        self.state[i] = CLOSED
        self.ready[i] = False

    def room(self, group: int) -> int:
        """Nodes the group may still add."""
        return int(((self.group_of == group) & (self.state == CLOSED)).sum())


@dataclass(frozen=True)
class Option:
    """One group's answer to the pending pods: how many nodes, which pods they take."""

    group: int
    nodes: int
    pods: tuple[int, ...]
    """Indexes into the pending list."""
    waste: float
    """Wasted CPU share + wasted memory share (cluster-autoscaler's least-waste)."""
    gpu_waste: float


def fit_key(pod: TracePod) -> tuple[int, int, int, int, tuple[str, ...]]:
    """What decides whether a pod fits a node: pods alike here fit the same nodes."""
    return (pod.cpu_milli, pod.memory_mib, pod.num_gpu, pod.gpu_milli, pod.gpu_spec)


def pack(templates: Sequence[TraceNode], pods: Sequence[TracePod], limit: int) -> list[int]:
    """Pods placed first fit onto fresh nodes, in order: each pod's node, -1 for none.

    With several ``templates``, those nodes are filled. With one, it is copied onto as many
    new nodes as the pods need, at most ``limit``: a group's estimate. Feasibility and the GPU
    taken are ``milligpu.Cluster``'s. Nodes only fill up during a pack, so once a pod finds no
    room on the open nodes, a pod alike finds none there either and is not tried again on them.
    """
    single = len(templates) == 1
    size = min(limit, 64) if single else len(templates)
    if size <= 0 or not pods:
        return [-1] * len(pods)
    scratch = Cluster(list(templates) * size if single else list(templates))
    opened = 0 if single else size
    refused: dict[tuple[int, int, int, int, tuple[str, ...]], int] = {}
    fresh: dict[tuple[int, int, int, int, tuple[str, ...]], bool] = {}
    where = []
    for pod in pods:
        key = fit_key(pod)
        if refused.get(key, -1) < opened:
            mask = scratch.feasible(pod)
            hit = np.flatnonzero(mask[:opened])
            if len(hit):
                i = int(hit[0])
                scratch.place(i, pod, scratch.best_fit_gpus(i, pod))
                where.append(i)
                continue
            refused[key] = opened
            if single and key not in fresh:
                fresh[key] = bool(mask[opened]) if opened < size else _fits_empty(templates[0], pod)
        if not single or not fresh[key] or opened >= limit:
            where.append(-1)
            continue
        if opened == size:
            size = min(limit, 2 * size)
            scratch = _grown(scratch, templates[0], size)
        i = opened
        opened += 1
        scratch.place(i, pod, scratch.best_fit_gpus(i, pod))
        where.append(i)
    return where


def _fits_empty(template: TraceNode, pod: TracePod) -> bool:
    return bool(Cluster([template]).feasible(pod)[0])


def _grown(scratch: Cluster, template: TraceNode, size: int) -> Cluster:
    """The scratch cluster with room for ``size`` nodes, its nodes' use kept."""
    bigger = Cluster([template] * size)
    n = len(scratch)
    bigger.cpu[:n] = scratch.cpu
    bigger.mem[:n] = scratch.mem
    bigger.free[:n] = scratch.free
    return bigger


def estimate(
    groups: Sequence[NodeGroup],
    room: Sequence[int],
    pending: Sequence[TracePod],
    fits: Sequence[BoolArray],
) -> list[Option]:
    """Each group's option for the pending pods: its estimate packs the pods an empty node of
    the group fits (``fits[j][k]``: pod j on group k) onto at most ``room[k]`` new nodes.
    Groups with no room or fitting none of the pods give no option."""
    options = []
    for k, group in enumerate(groups):
        shape = group.template
        candidates = [j for j in range(len(pending)) if fits[j][k]]
        if not candidates or room[k] <= 0:
            continue

        def score(j: int, shape: TraceNode = shape) -> float:
            pod = pending[j]
            return pod.cpu_milli / max(1, shape.cpu_milli) + pod.memory_mib / max(
                1, shape.memory_mib
            )

        ordered = sorted(candidates, key=score, reverse=True)
        where = pack([shape], [pending[j] for j in ordered], min(room[k], len(ordered)))
        taken = [j for j, w in zip(ordered, where, strict=True) if w >= 0]
        count = max(where) + 1
        cpu = sum(pending[j].cpu_milli for j in taken)
        mem = sum(pending[j].memory_mib for j in taken)
        gpu = sum(pending[j].gpu_request_milli for j in taken)
        waste = (1 - cpu / (count * shape.cpu_milli)) + (1 - mem / (count * shape.memory_mib))
        total_gpu = count * shape.gpus * MILLI_PER_GPU
        gpu_waste = 1 - gpu / total_gpu if total_gpu else 0.0
        options.append(Option(k, count, tuple(taken), waste, gpu_waste))
    return options


def least_waste(options: Sequence[Option]) -> Option | None:
    """cluster-autoscaler's least-waste, ties by GPU waste, then the earlier group."""
    return min(options, key=lambda o: (o.waste, o.gpu_waste, o.group), default=None)


def run_autoscaling(
    nodes: Sequence[TraceNode],
    pods: Sequence[TracePod],
    policy_name: str,
    seed: int,
    *,
    settings: Settings | None = None,
    load: float = LOAD,
    volume: float = VOLUME,
    stream: Sequence[TracePod] | None = None,
    times: Sequence[float] | None = None,
) -> AutoscaleRun:
    """One seed of the autoscaling protocol under one simulator policy.

    ``nodes`` are the trace's (they give the groups and the demand's scale), ``pods`` the
    trace's pod list (FGD's statistics, and the stream unless ``stream`` is given).
    ``stream`` and ``times`` replace the seed's stream and its arrival times (tests).
    """
    began = time.perf_counter()
    settings = settings or Settings()
    policy: PlacementPolicy = make_policy(policy_name, pods)
    groups = node_groups(nodes, settings.headroom)
    pool = Pool(groups, seed)
    cluster = pool.cluster
    if stream is None:
        stream = arrival_stream(pods, nodes, seed=seed, tune=volume)
    if times is None:
        times = arrival_times(stream, load * capacity_milli(nodes))
    if len(times) != len(stream):
        raise ValueError(f"times has {len(times)} entries for {len(stream)} pods; give one each")
    templates = Cluster([g.template for g in groups])
    run = AutoscaleRun(policy_name, seed)
    end = times[-1] if times else 0.0
    run.span_h = end / HOUR

    departures: list[tuple[float, int, int, TracePod, list[int]]] = []
    provisioning: list[tuple[float, int]] = []  # (ready at, slot)
    waiting: list[tuple[float, TracePod]] = []  # (since, pod), oldest first
    empty_since: dict[int, float] = {}
    order = 0
    dirty = False
    clock = 0.0
    last = 0.0
    last_up = -math.inf
    held = 0
    queued = 0
    areas = {"nodes": 0.0, "gpus": 0.0, "held": 0.0, "queued": 0.0}
    group_area = np.zeros(len(groups))
    waits: list[float] = []
    marks: list[tuple[float, int]] = [(0.0, 0)]
    bought = 0
    bought_gpus = 0
    per_group = np.zeros(len(groups), dtype=np.int64)

    def advance(to: float) -> None:
        nonlocal last
        to = min(to, end)
        if to > last:
            span = to - last
            areas["nodes"] += bought * span
            areas["gpus"] += bought_gpus * span
            areas["held"] += held * span
            areas["queued"] += queued * span
            group_area[:] += per_group * span
            last = to

    def place(pod: TracePod) -> bool:
        nonlocal held, order
        mask = cluster.feasible(pod) & pool.ready
        if not mask.any():
            return False
        node, gpus = policy.choose(cluster, pod, mask)
        cluster.place(node, pod, gpus)
        pool.pods[node] += 1
        empty_since.pop(node, None)
        held += pod.gpu_request_milli
        order += 1
        heapq.heappush(
            departures, (clock + max(MIN_RUN_S, pod.duration_s), order, node, pod, list(gpus))
        )
        return True

    def retry() -> None:
        """Waiting pods, oldest first, onto whatever changed; placing only fills nodes, so a
        pod alike to one that found no node finds none either."""
        nonlocal waiting, queued, dirty
        still = []
        refused = set()
        for since, pod in waiting:
            key = fit_key(pod)
            if key not in refused and place(pod):
                dirty = True
                queued -= pod.gpu_request_milli
                waits.append(clock - since)
            else:
                refused.add(key)
                still.append((since, pod))
        waiting = still

    def scale_up() -> None:
        """One loop's scale-up; nothing to do unless the waiting pods or the nodes on their
        way changed since the last loop (the same question has the same answer)."""
        nonlocal last_up, bought, bought_gpus, dirty
        if not waiting or not dirty:
            return
        dirty = False
        pending = [pod for _, pod in waiting]
        upcoming = sorted(i for _, i in provisioning)
        if upcoming:
            where = pack([cluster.nodes[i] for i in upcoming], pending, len(upcoming))
            pending = [p for p, w in zip(pending, where, strict=True) if w < 0]
        if not pending:
            return
        known: dict[tuple[int, int, int, int, tuple[str, ...]], BoolArray] = {}
        fits = []
        for p in pending:
            key = fit_key(p)
            if key not in known:
                known[key] = templates.feasible(p)
            fits.append(known[key])
        room = [pool.room(k) for k in range(len(groups))]
        options = estimate(groups, room, pending, fits)
        run.refused_at_max += sum(
            1 for k in range(len(groups)) if room[k] == 0 and any(f[k] for f in fits)
        )
        chosen = least_waste(options)
        if chosen is None:
            return
        slots = pool.open(chosen.group, chosen.nodes)
        ready_at = clock + settings.provision_s
        for i in slots:
            heapq.heappush(provisioning, (ready_at, i))
        bought += len(slots)
        bought_gpus += sum(cluster.nodes[i].gpus for i in slots)
        per_group[chosen.group] += len(slots)
        run.scale_ups += 1
        run.nodes_added += len(slots)
        last_up = clock
        dirty = True  # the pods this group did not take ask again at the next loop

    def scale_down() -> None:
        nonlocal bought, bought_gpus, dirty
        if clock - last_up < settings.delay_after_add_s:
            return
        due = sorted(
            (since, i) for i, since in empty_since.items() if clock - since >= settings.unneeded_s
        )
        for _, i in due[: settings.max_delete]:
            pool.close(i)
            del empty_since[i]
            bought -= 1
            bought_gpus -= cluster.nodes[i].gpus
            per_group[pool.group_of[i]] -= 1
            run.nodes_removed += 1
            dirty = True  # a group at its maximum has room again

    nxt = 0
    tick = 0.0
    while nxt < len(stream):
        next_departure = departures[0][0] if departures else math.inf
        next_ready = provisioning[0][0] if provisioning else math.inf
        at = min(next_departure, next_ready, times[nxt], tick)
        advance(at)
        clock = at
        if next_departure == at:
            while departures and departures[0][0] == at:
                _, _, node, pod, gpus = heapq.heappop(departures)
                remove(cluster, node, pod, gpus)
                pool.pods[node] -= 1
                held -= pod.gpu_request_milli
                if not pool.pods[node]:
                    empty_since[node] = clock
            retry()
        elif next_ready == at:
            while provisioning and provisioning[0][0] == at:
                _, i = heapq.heappop(provisioning)
                pool.make_ready(i)
                empty_since[i] = clock
            dirty = True
            retry()
        elif times[nxt] == at:
            while nxt < len(stream) and times[nxt] == at:
                pod = stream[nxt]
                nxt += 1
                policy.observe(pod)
                run.arrived += 1
                if not templates.feasible(pod).any():
                    run.unplaceable += 1
                if not place(pod):
                    queued += pod.gpu_request_milli
                    waiting.append((clock, pod))
                    dirty = True
        else:
            scale_up()
            scale_down()
            tick += settings.scan_s
        run.peak_nodes = max(run.peak_nodes, bought)
        if marks[-1][1] != bought:
            marks.append((clock, bought))
    advance(end)
    clock = end
    waits += [clock - since for since, _ in waiting if clock > since]
    run.node_hours = areas["nodes"] / HOUR
    run.gpu_hours = areas["gpus"] / HOUR
    run.held_gpu_hours = areas["held"] / (MILLI_PER_GPU * HOUR)
    run.waited_gpu_hours = areas["queued"] / (MILLI_PER_GPU * HOUR)
    run.waited_pods = len(waits)
    run.mean_wait_min = statistics.fmean(waits) / 60.0 if waits else 0.0
    run.longest_wait_min = max(waits, default=0.0) / 60.0
    run.groups = {g.name: float(a) / HOUR for g, a in zip(groups, group_area, strict=True) if a}
    run.series = _series(marks, end)
    run.seconds = time.perf_counter() - began
    return run


def _series(marks: Sequence[tuple[float, int]], end: float) -> list[tuple[float, int]]:
    """Nodes bought at ``SERIES`` evenly spaced times from 0 to ``end``."""
    if end <= 0:
        return [(0.0, marks[-1][1])]
    out = []
    j = 0
    for k in range(SERIES):
        at = end * k / (SERIES - 1)
        while j + 1 < len(marks) and marks[j + 1][0] <= at:
            j += 1
        out.append((at / HOUR, marks[j][1]))
    return out
