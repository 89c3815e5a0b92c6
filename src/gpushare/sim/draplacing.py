"""DRA mode on the memory-mode replay: stock first-fit, gpushare's DRA allocator, device plugin.

The same trace, the same cluster and the same arrival stream as ``sim.gpumem`` (one fixed
gpu-mem per pod as a user writes it, one try per pod, no departures), placed three ways:

- ``device-plugin``: ``gpumem.MemoryCluster`` as it is, the extender's core with the node policy
  (``gpushare``, the default: fragmentation-aware inside and across nodes).
- ``dra``: every node becomes the ResourceSlice its DRA driver publishes
  (``core.dra.slices.build_slice``, read back through ``core.dra.ledger``), every GPU pod the
  pod and ResourceClaim the webhook makes (``capacity.requests.memory`` = the units it asks,
  ``count`` = its GPUs), and ``core.dra.allocate.allocate`` chooses node and GPUs with the same
  scheduler core and policy; the claim's allocation is read back into the ledger
  (``Ledger.claim``), so what is counted is what the claim's status records.
- ``first-fit``: a model of the stock path. Device choice is the upstream structured allocator's
  (k8s.io/dynamic-resource-allocation v0.36 ``structured/internal/incubating``): the first
  devices in published order (``gpu-0``, ``gpu-1``, ...) with room, the first full solution
  taken, no scoring. Node choice is kube-scheduler's default profile for a pod whose GPUs come
  from a claim: the DRA plugin scores nothing without prioritized lists, so NodeResourcesFit
  (LeastAllocated over CPU and memory, weight 1) and NodeResourcesBalancedAllocation (weight 1)
  decide (pkg/scheduler/apis/config/v1/default_plugins.go, v1.36), every feasible node scored
  (``percentageOfNodesToScore`` 100; the default adaptive sampling only narrows it further), ties
  to the earliest node in the seed's order (the real scheduler picks among ties at random).
  ``first-fit-order`` keeps the device rule and takes the first feasible node in the seed's
  order instead: the best packing a stock scheduler could get from node order alone, reported
  so first-fit is not judged by LeastAllocated's spreading only.

Counted after every pod: unallocated GPU memory % (as ``gpumem``), GPUs holding any share, and
fragmented memory (free memory on GPUs that hold a share, % of all memory).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from gpushare.core.dra.allocate import (
    Allocated,
    ClaimRequest,
    NodeView,
    allocate,
    claim_request,
)
from gpushare.core.dra.ledger import DraLedger, read_holding, read_ledger
from gpushare.core.dra.slices import SliceSpec, build_slice
from gpushare.core.model.hostresources import HostResources
from gpushare.core.model.inventory import Gpu, NodeInventory
from gpushare.core.model.names import DRA_DEVICE_CLASS
from gpushare.kube.port import KubeDict
from gpushare.sim.gpumem import MemoryCluster, MemorySettings, node_json, pod_json
from gpushare.sim.openb import TraceNode, TracePod

MODES = ("first-fit", "first-fit-order", "dra", "device-plugin")
MIB = 1024 * 1024


def claim_json(pod: TracePod, *, uid: str, units_per_gpu: int, unit_mib: int) -> KubeDict:
    """The ResourceClaim the webhook makes for a one-container pod (docs/dra.md)."""
    count = max(1, pod.num_gpu)
    exactly: dict[str, Any] = {
        "deviceClassName": DRA_DEVICE_CLASS,
        "allocationMode": "ExactCount",
        "count": count,
        "capacity": {"requests": {"memory": f"{units_per_gpu * unit_mib}Mi"}},
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": f"{pod.name}-{uid}-gpushare",
            "namespace": "default",
            "uid": f"c{uid}",
        },
        "spec": {"devices": {"requests": [{"name": "main", "exactly": exactly}]}},
    }


def dra_pod_json(pod: TracePod, *, uid: str) -> KubeDict:
    """The pod after the webhook's conversion: no ACK resources, its CPU, memory and models."""
    obj = pod_json(pod, uid=uid, units_per_gpu=0, core_per_gpu=0, unit=MemorySettings().unit)
    for container in obj["spec"]["containers"]:
        container["resources"].pop("limits", None)
    return obj


class DraCluster(MemoryCluster):
    """``MemoryCluster`` whose GPU pods go through ``core.dra.allocate`` (see the module)."""

    def __init__(
        self,
        nodes: Sequence[TraceNode],
        *,
        policy: str,
        seed: int,
        settings: MemorySettings | None = None,
    ) -> None:
        super().__init__(nodes, policy=policy, seed=seed, settings=settings)
        unit = self.settings.unit
        slices = [
            build_slice(
                SliceSpec(
                    node=inv.name,
                    unit=unit,
                    mode=inv.mode,
                    gpus=tuple(
                        Gpu(
                            index=g.index,
                            mem_units=g.mem_units,
                            uuid=f"{inv.name}-{g.index}",
                            model=n.model,
                        )
                        for g in inv.gpus
                    ),
                )
            )
            for inv, n in zip(self.inventories, self.nodes, strict=True)
        ]
        self.dra: DraLedger = read_ledger(slices, ())
        self.views: list[NodeInventory] = [
            _with_host(self.dra.inventory(inv.name), inv) for inv in self.inventories
        ]
        for i, view in enumerate(self.views):
            self.state.nodes[view.name] = view
            self.inventories[i] = view
        self.pods_on: list[int] = [0] * len(self.nodes)
        self._labels: dict[int, dict[str, str]] = {}

    def place(self, pod: TracePod, uid: str) -> tuple[int, str]:
        if not pod.num_gpu:
            return super().place(pod, uid)
        need = self.need(pod)
        model = self.model_mask(pod.gpu_spec)
        room = (self.cpu >= pod.cpu_milli) & (self.mem >= pod.memory_mib)
        gpus = ((self.free >= need).sum(axis=1) >= pod.num_gpu) & (need > 0)
        candidates = np.flatnonzero(model & room & gpus)
        obj = dra_pod_json(pod, uid=uid)
        claim = claim_json(pod, uid=uid, units_per_gpu=need, unit_mib=self.settings.unit.mib)
        requests = (
            ClaimRequest("main", max(1, pod.num_gpu), need * self.settings.unit.mib * MIB, 0),
        )
        request = claim_request(obj, requests, self.settings.unit)
        if self.scheduler.workload is not None:  # the extender counts the claim's shape
            self.scheduler.workload.count(uid, request)
        order = sorted((int(i) for i in candidates), key=lambda i: int(self.rank[i]))
        views = [
            NodeView(
                inventory=self.inventories[i],
                node=self._node_object(i),
                used=HostResources(
                    (self.nodes[i].cpu_milli - int(self.cpu[i])),
                    (self.nodes[i].memory_mib - int(self.mem[i])) * MIB,
                ),
                pods=self.pods_on[i],
            )
            for i in order
        ]
        outcome = allocate(
            obj,
            claim,
            views,
            self.ledger,
            self.scheduler,
            unit=self.settings.unit,
            cluster=self.state.nodes,
            requests=requests,
        )
        if not isinstance(outcome, Allocated):
            return 0, "no node" if not len(candidates) else "core filter"
        # what the claim's status records is what counts: read it back as the ledger does
        claim["status"] = outcome.status
        read, problems = read_holding(claim, self.dra.nodes)
        if read is None or problems:
            raise AssertionError(f"the allocation written does not read back: {problems}")
        self.ledger.claim(read.allocation)
        i = self.index[outcome.node]
        bound = dict(obj)
        bound["spec"] = dict(obj["spec"], nodeName=outcome.node)
        self.state.apply_pod("ADDED", bound)  # the pod's CPU and memory, as the watch shows it
        self.cpu[i] -= pod.cpu_milli
        self.mem[i] -= pod.memory_mib
        self.pods_on[i] += 1
        for share in read.allocation.gpus:
            self.free[i, share.index] -= share.mem_units
        return read.allocation.mem_units, ""

    def _node_object(self, i: int) -> KubeDict:
        """The Node as the allocator reads it: its labels (the GPU model's among them, which a
        pod's required node affinity names) as ``MemoryCluster`` writes them."""
        labels = self._labels.get(i)
        if labels is None:
            node = node_json(self.nodes[i], self.settings, self.distance[i])
            labels = self._labels[i] = dict((node.get("metadata") or {}).get("labels") or {})
        return {
            "metadata": {"name": self.nodes[i].name, "labels": labels},
            "spec": {},
            "status": {},
        }


def _with_host(view: NodeInventory, inv: NodeInventory) -> NodeInventory:
    """The slice's view of a node with what the Node object adds (allocatable, placement)."""
    return replace(view, host=inv.host, placement=inv.placement, model=inv.model or view.model)


class FirstFitCluster(MemoryCluster):
    """The stock path's model (see the module docstring): first devices in published order;
    nodes by kube-scheduler's default scores (``by_order=False``) or the seed's order."""

    def __init__(
        self,
        nodes: Sequence[TraceNode],
        *,
        seed: int,
        by_order: bool,
        settings: MemorySettings | None = None,
    ) -> None:
        super().__init__(nodes, policy="binpack", seed=seed, settings=settings)
        self.by_order = by_order
        self.cpu0 = np.array([n.cpu_milli for n in self.nodes], dtype=np.float64)
        self.mem0 = np.array([n.memory_mib for n in self.nodes], dtype=np.float64)

    def place(self, pod: TracePod, uid: str) -> tuple[int, str]:
        if not pod.num_gpu:
            return super().place(pod, uid)
        need = self.need(pod)
        model = self.model_mask(pod.gpu_spec)
        room = (self.cpu >= pod.cpu_milli) & (self.mem >= pod.memory_mib)
        gpus = ((self.free >= need).sum(axis=1) >= pod.num_gpu) & (need > 0)
        candidates = np.flatnonzero(model & room & gpus)
        if not len(candidates):
            return 0, "no node"
        if self.by_order:
            i = int(candidates[np.argmin(self.rank[candidates])])
        else:
            cpu = (self.cpu0[candidates] - self.cpu[candidates] + pod.cpu_milli) / self.cpu0[
                candidates
            ]
            mem = (self.mem0[candidates] - self.mem[candidates] + pod.memory_mib) / self.mem0[
                candidates
            ]
            least = ((1 - cpu) * 100 + (1 - mem) * 100) / 2
            balanced = (1 - np.abs(cpu - mem) / 2) * 100
            score = np.floor(least) + np.floor(balanced)
            top = candidates[score == score.max()]
            i = int(top[np.argmin(self.rank[top])])
        chosen = [g for g in range(self.nodes[i].gpus) if self.free[i, g] >= need][: pod.num_gpu]
        self.cpu[i] -= pod.cpu_milli
        self.mem[i] -= pod.memory_mib
        for g in chosen:
            self.free[i, g] -= need
        return need * len(chosen), ""


@dataclass
class ModeRun:
    """One mode's replay of one seed, sampled where the cluster is full (arrived >= 100 %)."""

    mode: str
    gpus_used: int = 0
    gpus_used_early: int = 0
    """GPUs holding a share at ``early_at`` arrived %, before pods fail: fewer for the same
    memory is tighter packing."""
    unallocated: float = 0.0
    fragmented: float = 0.0
    failed: int = 0
    curve: list[tuple[float, float]] = field(default_factory=list)


def _cluster(mode: str, nodes: Sequence[TraceNode], seed: int, policy: str) -> MemoryCluster:
    if mode == "device-plugin":
        return MemoryCluster(nodes, policy=policy, seed=seed)
    if mode == "dra":
        return DraCluster(nodes, policy=policy, seed=seed)
    if mode in ("first-fit", "first-fit-order"):
        return FirstFitCluster(nodes, seed=seed, by_order=mode == "first-fit-order")
    raise ValueError(f"mode {mode!r} is not one of {', '.join(MODES)}")


def run_mode(
    mode: str,
    nodes: Sequence[TraceNode],
    stream: Sequence[TracePod],
    *,
    seed: int,
    policy: str = "gpushare",
    full_at: float = 100.0,
    early_at: float = 80.0,
) -> ModeRun:
    """Place the stream in one mode; sample GPUs used and fragmentation where arrived % first
    reaches ``full_at`` (the last pod when it never does)."""
    cluster = _cluster(mode, nodes, seed, policy)
    capacity = max(1, cluster.capacity)
    total = np.where(cluster.free >= 0, cluster.units[:, None], 0)
    run = ModeRun(mode)
    requested = 0.0
    allocated = 0
    sampled = False
    early = False
    for step, pod in enumerate(stream):
        requested += cluster.requested(pod)
        booked, reason = cluster.place(pod, str(step))
        allocated += booked
        if reason:
            run.failed += 1
        arrived = 100.0 * requested / capacity
        run.curve.append((arrived, 100.0 - 100.0 * allocated / capacity))
        if not early and arrived >= early_at:
            early = True
            run.gpus_used_early = int(((cluster.free >= 0) & (cluster.free < total)).sum())
        if not sampled and (arrived >= full_at or step == len(stream) - 1):
            sampled = True
            used = (cluster.free >= 0) & (cluster.free < total)
            run.gpus_used = int(used.sum())
            run.unallocated = 100.0 - 100.0 * allocated / capacity
            run.fragmented = 100.0 * float(cluster.free[used].sum()) / capacity
    return run
