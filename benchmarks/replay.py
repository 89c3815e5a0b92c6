"""The openb trace replayed on the real control plane, beside the memory-mode simulator.

``sim/gpumem.py`` places the trace with the extender's own core in one process. This benchmark
asks whether the real thing does the same: it starts the e2e harness's control plane
(``harness/cluster.py``: etcd, kube-apiserver, kube-scheduler with the ``ack-co-scheduler``
profile of ``gpushare.schedconfig``, kube-controller-manager, ``gpushare extender --policy P``
and kwok), makes every trace node a kwok node and sends the seed's arrival stream through
kube-scheduler and the extender as real pods, one at a time, in order. It prints unallocated
GPU memory % at 90/95/100/110/130 % arrived per policy and the pods per second, beside the
simulator's numbers for the same seed and the same pods.

    python benchmarks/replay.py [--seeds 1 | --seed S ...] [--policy binpack ...]
                                [--nodes N] [--pods P] [--out replay-out]

The mapping (``node_manifest``, ``pod_manifest``):

- Node: ``gpumem.node_json`` (what the device plugin leaves: each card's memory at the unit,
  rounded down; the trace's CPU and memory as capacity and allocatable), managed by kwok, with
  the GPU model as the label ``aliyun.accelerator/nvidia_name``: the label ACK's GPU nodes carry
  and its "card model scheduling" selects on, and the one ``sim/kubeyaml.py`` reads. Its value
  is the trace's model code as written (``T4``, ``G2``, ``V100M32``): the trace does not say
  what ``G2`` and ``G3`` are, and the codes are valid label values. ``pods`` allocatable is
  ``MAX_PODS``: the simulator counts no pods per node, so kube-scheduler must not either.
- Pod: ``gpumem.pod_json`` with the amounts of ``gpumem.as_written`` (one fixed
  ``aliyun.com/gpu-mem``, times k with the label ``aliyun.com/gpu-count: k`` for k GPUs), the
  trace's CPU and memory requests, ``schedulerName: ack-co-scheduler``, and a node selector on
  this run's nodes (``gpushare-replay: <seed>``) so a shared cluster's other nodes stay out. A
  ``gpu_spec`` (models allowed, ``a|b``) becomes required node affinity
  ``aliyun.accelerator/nvidia_name In [a, b]``: the simulator's model filter. (The default
  trace names no model; the other openb traces do.)

How it stays exact:

- One try, in order. A GPU pod is created only after the one before it was bound or found
  unschedulable; an unschedulable pod is counted as failed and deleted at once. kube-scheduler
  is also given a one-hour pod backoff (``BACKOFF``) and SchedulerPopFromBackoffQ off
  (``SCHEDULER_GATES``) so that a failed pod is not tried again before it is gone. Waiting
  costs throughput (each pod pays a full round trip), but a pod scheduled while the previous
  bind is still in flight would be decided by an extender that has not booked that bind yet,
  which the simulator never does.
- Ties. The simulator gives equal scores to the earliest node in a seeded order
  (``gpumem.node_ranks``); the extender's ``single_top`` gives them to the first name. Node
  names are ``<rank>-<trace name>`` with a zero-padded rank, so name order is the seed's order.
- Generic scores. The ``ack-co-scheduler`` profile scores every feasible node and leaves no
  generic score that differs between these nodes (``schedconfig.packing_profile``), so the
  extender's single top node is the one kube-scheduler binds.
- CPU-only pods (1,088 of the default trace's 8,152) are part of the stream and take CPU and
  memory that later GPU pods need. kube-scheduler gives them no GPU score and picks at random
  among equal nodes, which no simulator can follow, so the replay binds them itself
  (``spec.nodeName``) where the simulator puts them: the first node in the seed's order with
  room for their CPU and memory, by the replay's own count of what every pod placed so far
  requested. kube-scheduler's cache and NodeResourcesFit then see them like any bound pod.

Counting is the simulator's: arrived % = units requested as written (failed pods included) /
all units; unallocated % = 100 - units booked (from each bound pod's
``gpushare.io/allocation``) / all units. Throughput is GPU pods decided (bound or failed) per
second of the run, one at a time.

The traces are read from ``../shared/traces/openb`` beside the project; without them the
benchmark says so and exits with 2.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import re
import shutil
import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the harness lives in harness/
    sys.path.insert(0, str(ROOT))

from gpushare.core.model.gpumodel import LABEL_MODEL  # noqa: E402
from gpushare.core.model.inventory import Mode  # noqa: E402
from gpushare.core.records.allocation import from_pod  # noqa: E402
from gpushare.kube.port import KubeDict  # noqa: E402
from gpushare.sim import gpumem  # noqa: E402
from gpushare.sim.kubeyaml import card_units  # noqa: E402
from gpushare.sim.milligpu import Run  # noqa: E402
from gpushare.sim.openb import TraceNode, TracePod, read_nodes, read_pods  # noqa: E402
from harness.cluster import Cluster, StartError, running_cluster  # noqa: E402
from harness.clusterctl import _down  # noqa: E402

TRACES = ROOT.parent / "shared" / "traces" / "openb"
NODE_LIST = "openb_node_list_gpu_node.csv"
POINTS = (90, 95, 100, 110, 130)
POLICIES = ("binpack", "fgd", "gpushare")
RUN_LABEL = "gpushare-replay"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
WATCH_SETTLE_S = 0.05
"""Pause after the replay's own watch has shown a CPU-only pod it bound: the extender's policy
counts the CPU the pod takes from its watch of the same apiserver, and the next GPU pod must
not be decided before that event arrives there too. Waiting for the replay's own watch first
starts the pause once the apiserver has sent the event out, not when the create returned."""
MAX_PODS = 5000
"""``pods`` allocatable on every replay node: more than any node ever holds in the trace."""
BACKOFF = 3600
"""kube-scheduler's pod backoff (seconds) in the replay: a failed pod is never retried."""
SCHEDULER_GATES = {"SchedulerPopFromBackoffQ": False}
"""kube-scheduler since 1.33 takes pods from the backoff queue early whenever nothing else is
waiting (pkg/scheduler/backend/queue/active_queue.go), so the hour-long backoff alone did not
keep a failed pod from being tried again: its logs showed second attempts of pods the replay
had already deleted, overlapping the next pod. Off, each pod gets one try."""
NODE_LEASE_S = 1200
"""kwok's node lease: renewed every 5 minutes, not every 10 s, so that 1,213 nodes' leases do
not cost the control plane more than the pods do."""
NAMESPACE = "replay"
DECIDE_TIMEOUT = 120.0
"""Seconds one pod may take to be bound or found unschedulable before the run is abandoned."""
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


class ReplayError(RuntimeError):
    """The replay cannot go on (bad input, or the cluster did something unexpected)."""


# -- the workload ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """One seed's nodes (in the trace's order), their Kubernetes names, and the pod stream."""

    seed: int
    nodes: list[TraceNode]
    names: list[str]
    """Kubernetes node name per node: ``<rank>-<trace name>``, so name order = tie order."""
    stream: list[TracePod]
    settings: gpumem.MemorySettings

    @property
    def capacity(self) -> int:
        """All memory units of the nodes."""
        unit = self.settings.unit
        return sum(card_units(n, unit) * n.gpus for n in self.nodes)

    def per_gpu(self, pod: TracePod) -> int:
        """Units per GPU the pod asks for as written; 0 when no card may take it."""
        return gpumem.pod_units(pod, 0, self.settings.unit) if pod.gpu_mem_mib else 0


def sliced(nodes: Sequence[TraceNode], count: int | None) -> list[TraceNode]:
    """``count`` nodes spread evenly over the list (the file groups nodes by model), or all."""
    if count is None or count >= len(nodes):
        return list(nodes)
    if count < 1:
        raise ReplayError(f"--nodes={count}: must be at least 1")
    return [nodes[i * len(nodes) // count] for i in range(count)]


def replay_names(nodes: Sequence[TraceNode], seed: int) -> list[str]:
    """Each node's Kubernetes name: its zero-padded rank in the seed's order, then its name."""
    ranks = gpumem.node_ranks(len(nodes), seed)
    width = len(str(max(0, len(nodes) - 1)))
    names = [
        f"{rank:0{width}d}-{node.name.lower()}" for rank, node in zip(ranks, nodes, strict=True)
    ]
    for node, name in zip(nodes, names, strict=True):
        if not DNS_NAME.match(name):
            raise ReplayError(
                f"node {node.name!r}: the Kubernetes name {name!r} is not a DNS subdomain "
                f"(lower-case letters, digits, '-' and '.', at most 253 characters)"
            )
    return names


def workload(
    nodes: Sequence[TraceNode],
    pods: Sequence[TracePod],
    *,
    seed: int,
    limit: int | None = None,
    settings: gpumem.MemorySettings | None = None,
) -> Workload:
    """The seed's stream over ``nodes`` (``gpumem.stream``, inflated to 1.3 x all units),
    cut to its first ``limit`` pods."""
    settings = settings or gpumem.MemorySettings()
    gpumem.check(nodes, settings.unit)
    for node in nodes:
        if Mode.from_label(settings.mode_label(node)) is Mode.CORE_MEM:
            raise ReplayError(
                f"node {node.name}: mode=core_mem is not replayed: the simulator writes a "
                f"different pod for core_mem nodes, and a real pod is one manifest"
            )
        if node.model and not LABEL_VALUE.match(node.model):
            raise ReplayError(
                f"node {node.name}: model={node.model!r} is not a valid label value for "
                f"{LABEL_MODEL} (letters, digits, '-', '_', '.'; at most 63 characters)"
            )
    stream = cut(gpumem.stream(pods, nodes, seed=seed, unit=settings.unit), nodes, settings)
    if limit is not None:
        if limit < 1:
            raise ReplayError(f"--pods={limit}: must be at least 1")
        stream = stream[:limit]
    return Workload(seed, list(nodes), replay_names(nodes, seed), stream, settings)


def cut(
    stream: Sequence[TracePod],
    nodes: Sequence[TraceNode],
    settings: gpumem.MemorySettings,
    tune: float = 1.3,
) -> list[TracePod]:
    """The stream up to ``tune`` x all units, as written.

    ``gpumem.stream`` inflates the shuffled trace until it asks for 1.3 x the cluster's memory,
    but never shortens it: on a slice of the nodes the whole trace asks for many times their
    memory. Here it stops before the first pod that would pass 1.3 x, as the inflation does, so
    a slice is replayed to 130 % arrived and no further (the whole cluster's stream is kept).
    """
    unit = settings.unit
    limit = tune * sum(card_units(n, unit) * n.gpus for n in nodes)
    total = 0.0
    for step, pod in enumerate(stream):
        if pod.gpu_mem_mib:
            total += gpumem.pod_units(pod, 0, unit) * pod.num_gpu
        if total > limit:
            return list(stream[:step])
    return list(stream)


def node_manifest(node: TraceNode, name: str, load: Workload) -> KubeDict:
    """The kwok node for a trace node (see the module docstring)."""
    obj = gpumem.node_json(dataclasses.replace(node, name=name), load.settings)
    meta = obj["metadata"]
    meta["annotations"][KWOK_ANNOTATION] = "fake"
    meta["labels"][RUN_LABEL] = str(load.seed)
    for part in ("capacity", "allocatable"):
        obj["status"][part]["pods"] = str(MAX_PODS)
    return obj


def pod_manifest(pod: TracePod, step: int, load: Workload) -> KubeDict:
    """The pod a user writes for step ``step`` of the stream (see the module docstring)."""
    obj = gpumem.pod_json(
        pod,
        uid=str(step),
        units_per_gpu=load.per_gpu(pod),
        core_per_gpu=gpumem.pod_core(pod, core_mem=False),
        unit=load.settings.unit,
    )
    meta = obj["metadata"]
    del meta["uid"]  # the API server assigns it
    meta["name"] = f"s{step:05d}-{pod.name.lower()}"
    meta["namespace"] = NAMESPACE
    spec = obj["spec"]
    spec["nodeSelector"] = {RUN_LABEL: str(load.seed)}
    spec["terminationGracePeriodSeconds"] = 0
    return obj  # gpu_spec is already required affinity on the model label (gpumem.pod_json)


# -- outcomes -------------------------------------------------------------------------------


@dataclass
class Outcome:
    """One policy's replay of one seed, real or simulated."""

    policy: str
    seed: int
    where: str
    """"real" or "sim"."""
    run: Run
    placed: list[int | None] = field(default_factory=list)
    """Node index per step (None: failed)."""
    gpus: list[tuple[int, ...]] = field(default_factory=list)
    """GPU indices booked per step (empty: CPU-only or failed): two runs can part inside a
    node, and the node-level trace shows it only at a later step."""
    seconds: float = 0.0
    decided: int = 0
    """GPU pods decided (bound or failed)."""

    @property
    def rate(self) -> float:
        """GPU pods decided per second."""
        return self.decided / self.seconds if self.seconds > 0 else math.nan

    def points(self) -> dict[int, float]:
        """Unallocated % at each of ``POINTS`` arrived (NaN where the run did not get there)."""
        return {p: self.run.at(p) for p in POINTS}

    def last(self) -> tuple[float, float]:
        """(arrived %, unallocated %) after the last pod."""
        if not self.run.arrived:
            return (0.0, 100.0)
        return (self.run.arrived[-1], self.run.unallocated[-1])


def agreement_point(real: Outcome, sim: Outcome) -> tuple[str, float, float]:
    """Where the two are compared: 100 % arrived when both got there, else the last pod."""
    a, b = real.run.at(100), sim.run.at(100)
    if not (math.isnan(a) or math.isnan(b)):
        return ("100 %", a, b)
    return (f"last pod ({real.last()[0]:.1f} %)", real.last()[1], sim.last()[1])


def differences(real: Outcome, sim: Outcome) -> tuple[int, int | None]:
    """(steps placed on a different node or GPUs, or where only one failed; the first)."""
    a = zip(real.placed, real.gpus, strict=True)
    b = zip(sim.placed, sim.gpus, strict=True)
    steps = [i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y]
    return len(steps), (steps[0] if steps else None)


def simulate(load: Workload, policy: str) -> Outcome:
    """The memory-mode simulator on the same stream: ``gpumem.replay`` step by step, also
    noting where each pod went (the ledger for GPU pods, the CPU book for the others)."""
    cluster = gpumem.MemoryCluster(
        load.nodes, policy=policy, seed=load.seed, settings=load.settings
    )
    outcome = Outcome(policy, load.seed, "sim", Run(policy=policy))
    capacity = max(1, cluster.capacity)
    requested = 0.0
    allocated = 0
    started = time.perf_counter()
    for step, pod in enumerate(load.stream):
        requested += cluster.requested(pod)
        where = None if pod.num_gpu else _cpu_node(cluster, pod)
        booked, reason = cluster.place(pod, str(step))
        allocated += booked
        gpus: tuple[int, ...] = ()
        if reason:
            outcome.run.failed[reason] = outcome.run.failed.get(reason, 0) + 1
        elif pod.num_gpu:
            holding = cluster.ledger.holding(str(step))
            where = cluster.index[holding.node] if holding else None
            gpus = tuple(sorted(holding.indexes)) if holding else ()
        outcome.placed.append(None if reason else where)
        outcome.gpus.append(gpus)
        if pod.num_gpu:
            outcome.decided += 1
        outcome.run.arrived.append(100.0 * requested / capacity)
        outcome.run.unallocated.append(100.0 - 100.0 * allocated / capacity)
    outcome.seconds = time.perf_counter() - started
    return outcome


def _cpu_node(cluster: gpumem.MemoryCluster, pod: TracePod) -> int | None:
    """Where ``MemoryCluster.place`` puts a CPU-only pod: the first node in the seed's order
    with room for its CPU and memory (None: nowhere)."""
    fits = (
        cluster.model_mask(pod.gpu_spec)
        & (cluster.cpu >= pod.cpu_milli)
        & (cluster.mem >= pod.memory_mib)
    )
    candidates = np.flatnonzero(fits)
    return int(candidates[np.argmin(cluster.rank[candidates])]) if len(candidates) else None


# -- the real cluster -----------------------------------------------------------------------


class Api:
    """The few API calls the replay makes, over one HTTP/1.1 connection with the admin cert."""

    def __init__(self, cluster: Cluster) -> None:
        pki = cluster.pki
        self.server = cluster.server
        context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        self._auth: dict[str, Any] = {"verify": context}
        self.client = httpx.Client(base_url=self.server, timeout=60, **self._auth)

    def close(self) -> None:
        self.client.close()

    def call(self, method: str, path: str, body: Any = None, **params: Any) -> Any:
        """One request; a clear error with the API's message when it fails."""
        response = self.client.request(method, path, json=body, params=params or None)
        if response.status_code >= 300:
            raise ReplayError(f"{method} {path}: HTTP {response.status_code}: {response.text}")
        return response.json() if response.content else None

    def create_all(self, path: str, objects: Sequence[KubeDict], workers: int = 4) -> None:
        """POST many objects, a few connections at once."""

        def send(chunk: Sequence[KubeDict]) -> None:
            with httpx.Client(base_url=self.server, timeout=60, **self._auth) as client:
                for obj in chunk:
                    response = client.post(path, json=obj)
                    if response.status_code >= 300:
                        name = obj["metadata"]["name"]
                        raise ReplayError(
                            f"POST {path} {name}: HTTP {response.status_code}: {response.text}"
                        )

        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(send, [objects[i::workers] for i in range(workers)]))

    def delete_all(self, path: str, names: Sequence[str], workers: int = 4) -> None:
        """DELETE ``path/<name>`` with no grace for every name, a few connections at once."""

        def send(chunk: Sequence[str]) -> None:
            with httpx.Client(base_url=self.server, timeout=60, **self._auth) as client:
                for name in chunk:
                    response = client.delete(f"{path}/{name}", params={"gracePeriodSeconds": 0})
                    if response.status_code >= 300 and response.status_code != 404:
                        raise ReplayError(
                            f"DELETE {path}/{name}: HTTP {response.status_code}: {response.text}"
                        )

        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(send, [names[i::workers] for i in range(workers)]))

    def watch_pods(self, namespace: str, version: str) -> PodWatch:
        """Follow the namespace's pods from ``version`` on."""
        return PodWatch(self, namespace, version)


Decision = tuple[str, str, int, tuple[int, ...]]
"""("bound", node, units booked, GPU indices) or ("failed", reason and message, 0, ())."""


class PodWatch:
    """A background watch that records each pod's decision as soon as it shows."""

    def __init__(self, api: Api, namespace: str, version: str) -> None:
        self._api = api
        self._path = f"/api/v1/namespaces/{namespace}/pods"
        self._version = version
        self._decisions: dict[str, Decision] = {}
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        auth = self._api._auth
        try:
            with httpx.Client(base_url=self._api.server, timeout=None, **auth) as client:
                while not self._stop.is_set():
                    params = {"watch": "true", "resourceVersion": self._version}
                    with client.stream("GET", self._path, params=params) as response:
                        if response.status_code >= 300:
                            response.read()
                            raise ReplayError(f"watch {self._path}: {response.text}")
                        for line in response.iter_lines():
                            if self._stop.is_set():
                                return
                            if line:
                                self._event(json.loads(line))
        except BaseException as err:  # handed to the waiting thread
            if not self._stop.is_set():
                self._error = err
                with self._changed:
                    self._changed.notify_all()

    def _event(self, event: dict[str, Any]) -> None:
        pod = event.get("object") or {}
        if event.get("type") == "ERROR":
            raise ReplayError(f"watch {self._path} ended: {pod.get('message', pod)}")
        meta = pod.get("metadata") or {}
        self._version = meta.get("resourceVersion", self._version)
        if event.get("type") not in ("ADDED", "MODIFIED"):
            return
        name = meta.get("name", "")
        decision = decision_of(pod)
        if decision is None or name in self._decisions:
            return
        with self._changed:
            self._decisions[name] = decision
            self._changed.notify_all()

    def wait(self, name: str, timeout: float = DECIDE_TIMEOUT) -> Decision:
        """The pod's decision, once it has one."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while name not in self._decisions:
                if self._error is not None:
                    raise ReplayError(f"the pod watch failed: {self._error}") from self._error
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ReplayError(
                        f"pod {name} was neither bound nor found unschedulable within "
                        f"{timeout:.0f} s (see the kube-scheduler and extender logs)"
                    )
                self._changed.wait(left)
            return self._decisions.pop(name)

    def close(self) -> None:
        self._stop.set()


def decision_of(pod: dict[str, Any]) -> Decision | None:
    """Bound (with the units and the GPU indices its allocation books), failed, or not
    decided yet."""
    node = (pod.get("spec") or {}).get("nodeName")
    if node:
        booked = from_pod(pod)
        if booked is None:
            return ("bound", node, 0, ())
        return ("bound", node, booked.mem_units, tuple(sorted(booked.indexes)))
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            reason = condition.get("reason", "")
            if reason in ("Unschedulable", "SchedulerError"):
                return ("failed", f"{reason}: {condition.get('message', '')}", 0, ())
    return None


class RealReplay:
    """Nodes and pods of one workload on a running cluster, one policy after another."""

    def __init__(
        self, cluster: Cluster, load: Workload, say: Callable[[str], None] = print
    ) -> None:
        self.cluster = cluster
        self.load = load
        self.say = say
        self.api = Api(cluster)

    def close(self) -> None:
        self.api.close()

    def make_nodes(self) -> None:
        """Replace any earlier replay's nodes with this workload's; wait until schedulable."""
        self.remove_nodes()
        manifests = [
            node_manifest(n, name, self.load)
            for n, name in zip(self.load.nodes, self.load.names, strict=True)
        ]
        started = time.monotonic()
        self.api.create_all("/api/v1/nodes", manifests)
        wanted = set(self.load.names)
        deadline = time.monotonic() + 600
        while True:
            items = self.api.call("GET", "/api/v1/nodes", labelSelector=RUN_LABEL)["items"]
            ready = {
                n["metadata"]["name"]
                for n in items
                if not (n.get("spec") or {}).get("taints")
                and any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in (n.get("status") or {}).get("conditions") or []
                )
            }
            if wanted <= ready:
                break
            if time.monotonic() > deadline:
                raise ReplayError(f"{len(wanted - ready)} replay nodes not Ready after 600 s")
            time.sleep(1)
        self.say(f"{len(wanted)} kwok nodes Ready in {time.monotonic() - started:.0f} s")

    def remove_nodes(self) -> None:
        self.api.call("DELETE", "/api/v1/nodes", labelSelector=RUN_LABEL)
        deadline = time.monotonic() + 300
        while self.api.call("GET", "/api/v1/nodes", labelSelector=RUN_LABEL)["items"]:
            if time.monotonic() > deadline:
                raise ReplayError("earlier replay nodes still there after 300 s")
            time.sleep(1)

    def clear_pods(self) -> None:
        """Delete every replay pod (no grace), a few at once, and wait until the API has none.

        One by one rather than one DELETE of the collection: after a full run that is about
        9,000 bound pods, more than kube-apiserver deletes within its 60 s request timeout.
        """
        path = f"/api/v1/namespaces/{NAMESPACE}/pods"
        names = [p["metadata"]["name"] for p in self.api.call("GET", path)["items"]]
        if names:
            self.say(f"deleting {len(names)} pods of the previous run")
        self.api.delete_all(path, names)
        deadline = time.monotonic() + 300
        while self.api.call("GET", path, limit=1)["items"]:
            if time.monotonic() > deadline:
                raise ReplayError("replay pods still there after 300 s")
            time.sleep(0.5)

    def run(self, policy: str) -> Outcome:
        """The stream through kube-scheduler and the extender running ``policy``."""
        load = self.load
        with contextlib.suppress(ReplayError):  # exists from an earlier policy
            self.api.call(
                "POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}, "kind": "Namespace"}
            )
        self.clear_pods()
        # A fresh extender: its ledger and learned workload start empty, as the simulator's.
        self.cluster.start_extender(policy=policy)
        path = f"/api/v1/namespaces/{NAMESPACE}/pods"
        version = self.api.call("GET", path, limit=1)["metadata"]["resourceVersion"]
        watch = self.api.watch_pods(NAMESPACE, version)
        index = {name: i for i, name in enumerate(load.names)}
        ranks = np.array(gpumem.node_ranks(len(load.nodes), load.seed), dtype=np.int64)
        cpu = np.array([n.cpu_milli for n in load.nodes], dtype=np.int64)
        mem = np.array([n.memory_mib for n in load.nodes], dtype=np.int64)
        models: dict[tuple[str, ...], np.ndarray[Any, np.dtype[np.bool_]]] = {}
        capacity = max(1, load.capacity)
        outcome = Outcome(policy, load.seed, "real", Run(policy=policy))
        requested = 0.0
        allocated = 0
        started = time.monotonic()
        last_report = started
        try:
            for step, pod in enumerate(load.stream):
                per_gpu = load.per_gpu(pod)
                requested += per_gpu * pod.num_gpu
                obj = pod_manifest(pod, step, load)
                place: int | None = None
                gpus: tuple[int, ...] = ()
                if not pod.num_gpu:
                    mask = models.get(pod.gpu_spec)
                    if mask is None:
                        mask = models[pod.gpu_spec] = np.array(
                            [not pod.gpu_spec or n.model in pod.gpu_spec for n in load.nodes]
                        )
                    fits = np.flatnonzero(mask & (cpu >= pod.cpu_milli) & (mem >= pod.memory_mib))
                    if len(fits):
                        place = int(fits[np.argmin(ranks[fits])])
                        obj["spec"]["nodeName"] = load.names[place]
                        self.api.call("POST", path, obj)
                        # the extender counts its CPU from its own watch of the same apiserver
                        watch.wait(obj["metadata"]["name"])
                        time.sleep(WATCH_SETTLE_S)
                    else:
                        outcome.run.failed["CPU or host memory"] = (
                            outcome.run.failed.get("CPU or host memory", 0) + 1
                        )
                elif not per_gpu:
                    outcome.run.failed["GPU share"] = outcome.run.failed.get("GPU share", 0) + 1
                    outcome.decided += 1
                else:
                    self.api.call("POST", path, obj)
                    kind, what, units, booked = watch.wait(obj["metadata"]["name"])
                    outcome.decided += 1
                    if kind == "bound":
                        place = index[what]
                        allocated += units
                        gpus = booked
                    else:
                        reason = what.split(":", 1)[0]
                        outcome.run.failed[reason] = outcome.run.failed.get(reason, 0) + 1
                        self.api.call(
                            "DELETE", f"{path}/{obj['metadata']['name']}", gracePeriodSeconds=0
                        )
                if place is not None:
                    cpu[place] -= pod.cpu_milli
                    mem[place] -= pod.memory_mib
                outcome.placed.append(place)
                outcome.gpus.append(gpus)
                outcome.run.arrived.append(100.0 * requested / capacity)
                outcome.run.unallocated.append(100.0 - 100.0 * allocated / capacity)
                now = time.monotonic()
                if now - last_report >= 15 or step + 1 == len(load.stream):
                    last_report = now
                    self.say(
                        f"[real {policy} seed {load.seed}] {step + 1}/{len(load.stream)} pods, "
                        f"arrived {outcome.run.arrived[-1]:.1f} %, "
                        f"unallocated {outcome.run.unallocated[-1]:.1f} %, "
                        f"{outcome.decided / (now - started):.1f} GPU pods/s"
                    )
        finally:
            watch.close()
        outcome.seconds = time.monotonic() - started
        return outcome


@contextlib.contextmanager
def replay_cluster(root: Path, say: Callable[[str], None] = print) -> Iterator[Cluster]:
    """The harness's control plane in ``root`` (its own ports), with the replay's backoff."""
    if (root / "pids").exists():
        _down(root)
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    settings = {"podInitialBackoffSeconds": BACKOFF, "podMaxBackoffSeconds": BACKOFF}
    started = time.monotonic()
    with running_cluster(
        root,
        lambda step: say(f"starting {step}"),
        scheduler_settings=settings,
        scheduler_gates=SCHEDULER_GATES,
        pods_run=False,
        node_lease_s=NODE_LEASE_S,
    ) as cluster:
        say(f"control plane up in {time.monotonic() - started:.0f} s ({cluster.server})")
        try:
            yield cluster
        finally:
            cluster.stop()
            # stopped by the harness: no PIDs left for a later run to signal (they may be reused)
            (root / "pids").unlink(missing_ok=True)


# -- the command ----------------------------------------------------------------------------


def table(pairs: Sequence[tuple[Outcome, Outcome]]) -> str:
    """Real and simulated unallocated % at each point, pods/s, and the difference."""
    head = "policy    seed where" + "".join(f"{p:>8} %" for p in POINTS) + "   pods/s  failed"
    lines = [head]
    for real, sim in pairs:
        for o in (real, sim):
            cells = "".join(f"{v:>10.2f}" for v in o.points().values())
            failed = sum(o.run.failed.values())
            lines.append(
                f"{o.policy:<9} {o.seed:>4} {o.where:<5}{cells} {o.rate:>8.1f} {failed:>7}"
            )
        diff = "".join(
            f"{a - b:>+10.2f}"
            for a, b in zip(real.points().values(), sim.points().values(), strict=True)
        )
        count, first = differences(real, sim)
        where, a, b = agreement_point(real, sim)
        lines.append(
            f"{'':<9} {'':>4} {'diff':<5}{diff}   at {where}: {a - b:+.2f} points; "
            f"{count} of {len(real.placed)} pods placed differently (node or GPUs)"
            + (f" (first at step {first})" if first is not None else "")
        )
    return "\n".join(lines)


def as_json(real: Outcome, sim: Outcome) -> dict[str, Any]:
    """One pair for ``--out``."""
    count, first = differences(real, sim)
    where, a, b = agreement_point(real, sim)

    def one(o: Outcome) -> dict[str, Any]:
        return {
            "unallocated_at": {str(p): round(v, 3) for p, v in o.points().items()},
            "last": [round(x, 3) for x in o.last()],
            "failed": o.run.failed,
            "seconds": round(o.seconds, 1),
            "gpu_pods_per_second": round(o.rate, 2),
        }

    return {
        "policy": real.policy,
        "seed": real.seed,
        "pods": len(real.placed),
        "real": one(real),
        "sim": one(sim),
        "compared_at": where,
        "difference": round(a - b, 3),
        "placed_differently": count,
        "first_difference": first,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=1, help="seeds 0..N-1 (default 1)")
    parser.add_argument(
        "--seed", type=int, action="append", help="this seed only (repeat for more; not --seeds)"
    )
    parser.add_argument("--policy", action="append", choices=POLICIES)
    parser.add_argument("--nodes", type=int, default=None, help="N nodes spread over the list")
    parser.add_argument("--pods", type=int, default=None, help="the first P pods of the stream")
    parser.add_argument("--trace", default="default", help="openb_pod_list_<trace>.csv")
    parser.add_argument("--dir", type=Path, default=ROOT / ".cluster-replay")
    parser.add_argument("--out", type=Path, default=None, help="write replay.json here")
    args = parser.parse_args(argv)
    say: Callable[[str], None] = lambda line: print(line, flush=True)  # noqa: E731
    if not TRACES.exists():
        say(f"error: the openb traces are not at {TRACES}; put ../shared beside the project")
        return 2
    if args.seeds < 1:
        say(f"error: --seeds={args.seeds}: must be at least 1")
        return 2
    if any(seed < 0 for seed in args.seed or ()):
        say(f"error: --seed={min(args.seed)}: seeds are 0 or more")
        return 2
    seeds = args.seed or list(range(args.seeds))
    policies = args.policy or list(POLICIES)
    try:
        nodes = sliced(read_nodes(TRACES / NODE_LIST), args.nodes)
        pods = read_pods(TRACES / f"openb_pod_list_{args.trace}.csv")
        pairs: list[tuple[Outcome, Outcome]] = []
        with replay_cluster(args.dir.resolve(), say) as cluster:
            for seed in seeds:
                load = workload(nodes, pods, seed=seed, limit=args.pods)
                gpu = sum(1 for p in load.stream if p.num_gpu)
                say(
                    f"seed {seed}: {len(load.nodes)} nodes, {len(load.stream)} pods "
                    f"({gpu} with GPU), {load.capacity} units"
                )
                real = RealReplay(cluster, load, say)
                try:
                    real.make_nodes()
                    for policy in policies:
                        sim = simulate(load, policy)
                        say(f"[sim {policy} seed {seed}] done in {sim.seconds:.0f} s")
                        pairs.append((real.run(policy), sim))
                        say(table(pairs[-1:]))
                        if args.out:
                            write_out(args.out, pairs, load.names, say)
                finally:
                    real.close()
    except (ReplayError, StartError) as err:
        say(f"error: {err}")
        return 1
    say("\nunallocated GPU memory % at arrived %, real cluster beside the simulator")
    say(table(pairs))
    return 0


def write_out(
    out: Path,
    pairs: Sequence[tuple[Outcome, Outcome]],
    names: Sequence[str],
    say: Callable[[str], None],
) -> None:
    """``replay.json`` with every pair so far (a long run that stops keeps what it measured),
    and the last pair's node and GPUs per step, real and simulated
    (``placed-<policy>-<seed>.json``: ``<node>:<gpu>,<gpu>`` from ``names``, the node alone for
    a CPU-only pod, null for a failed one), to find where and why they part."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "replay.json"
    path.write_text(json.dumps([as_json(r, s) for r, s in pairs], indent=2) + "\n")
    real, sim = pairs[-1]

    def named(o: Outcome) -> list[str | None]:
        return [
            None if i is None else names[i] + (":" + ",".join(map(str, g)) if g else "")
            for i, g in zip(o.placed, o.gpus, strict=True)
        ]

    steps = out / f"placed-{real.policy}-{real.seed}.json"
    steps.write_text(json.dumps({"real": named(real), "sim": named(sim)}) + "\n")
    say(f"wrote {path} and {steps}")


if __name__ == "__main__":
    sys.exit(main())
