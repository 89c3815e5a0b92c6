"""The real node autoscalers, run beside the end-to-end cluster: cluster-autoscaler and Karpenter.

Both have a kwok cloud provider: a "new node" is a Node object they create, which the cluster's
kwok (it manages nodes annotated ``kwok.x-k8s.io/node=fake``, and both providers annotate theirs
so) keeps Ready and whose bound pods it runs. Facts about either are in
``../shared/docs/AUTOSCALERS.md`` (sections 1b and 1c), read from their code:

- cluster-autoscaler 1.36.1 (``running_cluster_autoscaler``): node groups come from template
  Nodes in a ConfigMap (``readNodesFrom: configmap``), grouped by the ``GROUP_LABEL`` label;
  ``IncreaseSize`` creates the template verbatim (labels, annotations, status) under the name
  ``<group>-<5 chars>``. So a template built by :func:`gpu_template` carries what gpushare's
  device plugin and kubelet publish on a real GPU node: ``aliyun.com/gpu-mem`` and
  ``aliyun.com/gpu-count`` in capacity and allocatable, and the ``gpushare.io/gpus`` inventory and
  ``gpushare.io/gpu-mem-unit`` annotations.
- Karpenter v1.15.0 (``running_karpenter``): NodePools of a ``KWOKNodeClass``, instance types
  from a JSON file whose ``resources`` become the created Node's allocatable. Its Node carries
  the NodePool template's labels and annotations, nothing per node.

What kubelet and gpushare's device plugin write on a real node that neither provider writes is
done by :func:`publishing_gpus`, a watcher standing in for them on the autoscalers' nodes: the
``kubernetes.io/hostname`` label (kubelet sets it to the node's name; a CA template would give
every node of a group the template's) and the per-node GPU inventory (the device plugin writes
``gpushare.io/gpus`` with its node's own GPU UUIDs, the unit and the GPU model labels,
``gpushare.node.publishing``). Karpenter's nodes get their inventory only from it; CA's have the
template's from creation and get their own UUIDs from it. ``delay_s`` holds the publishing back,
as a device plugin that starts after its node registered does.

Each autoscaler runs as its own process with its own log (``<cluster>/logs/<name>.log``), is
stopped by PID (SIGTERM, then SIGKILL) and leaves no node, ConfigMap or Karpenter object behind.
The binaries are built once by ``controlplane/autoscalers.sh`` and cached like the control
plane's; :func:`unavailable` says why one cannot run (tests skip with that reason).
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpushare.core.model.gpumodel import gpu_node_labels
from gpushare.core.model.inventory import Gpu, Mode, inventory_annotation
from gpushare.core.model.names import (
    ALLOCATION_MODE_DRA,
    ANN_NODE_GPUS,
    ANN_NODE_UNIT,
    LABEL_ALLOCATION_MODE,
    LABEL_NODE_GPUS_PUBLISHED,
)
from gpushare.core.model.units import MemoryUnit
from gpushare.kube.objects import gpu_node
from harness.cluster import Cluster, Process, wait_for
from harness.ports import free_port
from harness.seeding import KWOK_ANNOTATION, KWOK_VALUE

HERE = Path(__file__).resolve().parent
BUILD = HERE / "controlplane" / "autoscalers.sh"
CA_BINARY = "cluster-autoscaler"
KARPENTER_BINARY = "karpenter-kwok"

GROUP_LABEL = "gpushare-e2e/node-group"
"""The label naming a node's group: cluster-autoscaler's kwok provider groups its templates by
it (``nodegroups.fromNodeLabelKey``) and each Karpenter NodePool here sets it to its own name."""
CA_GROUP_ANNOTATION = "cluster-autoscaler.kwok.nodegroup/name"
CA_MIN_ANNOTATION = "cluster-autoscaler.kwok.nodegroup/min-count"
CA_MAX_ANNOTATION = "cluster-autoscaler.kwok.nodegroup/max-count"
CA_DESIRED_ANNOTATION = "cluster-autoscaler.kwok.nodegroup/desired-count"
"""The group's size when the provider starts; it must lie within min and max or the provider
exits (``cloudprovider/kwok/kwok_helpers.go`` ``parseAnnotations``, default 0), and each loop
replaces it with the nodes the group has (``kwok_provider.go`` ``Refresh``)."""
KARPENTER_NODEPOOL_LABEL = "karpenter.sh/nodepool"
HOSTNAME_LABEL = "kubernetes.io/hostname"
GIB_MIB = 1024

SCALE_UP = re.compile(r"\] Scale-up: setting group (\S+) size to (\d+)$", re.MULTILINE)
"""cluster-autoscaler's line for each scale-up it executes (``core/scaleup/orchestrator/
executor.go``, logged at level 0); the ScaledUpGroup event it also logs says "... instead of"."""


# -- building ---------------------------------------------------------------------------------


def build_autoscalers() -> dict[str, Path]:
    """Run autoscalers.sh (a no-op when cached) and map each file it made to its path:
    ``cluster-autoscaler`` (absent without ``../shared``), ``karpenter-kwok``, ``crds``."""
    result = subprocess.run(["bash", str(BUILD)], check=True, stdout=subprocess.PIPE, text=True)
    found: dict[str, Path] = {}
    for line in result.stdout.split():
        for path in Path(line).iterdir():
            found[path.name] = path
    return found


def unavailable(binaries: Mapping[str, Path], name: str) -> str:
    """Why ``name`` cannot run here ("" when it can)."""
    if name in binaries:
        return ""
    if name == CA_BINARY:
        return (
            "cluster-autoscaler is not built: its source, ../shared/vendor/"
            "cluster-autoscaler-1.36.1.tar.gz, is not beside the project (set GPUSHARE_SHARED "
            "to the shared folder, then run `make autoscalers`)"
        )
    return f"{name} is not built: run `make autoscalers` ({BUILD})"


# -- what a node of a group is ----------------------------------------------------------------


@dataclass(frozen=True)
class GpuShape:
    """A node shape: ``gpus`` GPUs of ``gib`` GiB each, counted in ``unit`` by the device plugin."""

    gpus: int
    gib: int
    unit: MemoryUnit = MemoryUnit.GiB
    model: str = "Tesla T4"

    @property
    def units_per_gpu(self) -> int:
        """Whole units one GPU offers (the device plugin's ``memory_mib // unit.mib``)."""
        return self.gib * GIB_MIB // self.unit.mib

    @property
    def gpu_mem(self) -> int:
        """The node's ``aliyun.com/gpu-mem`` (units over all GPUs)."""
        return self.gpus * self.units_per_gpu

    def inventory(self, node: str) -> tuple[Gpu, ...]:
        """The GPUs the device plugin of ``node`` would publish (UUIDs of that node)."""
        return tuple(
            Gpu(index=i, mem_units=self.units_per_gpu, uuid=f"GPU-{node}-{i}", model=self.model)
            for i in range(self.gpus)
        )


READY = {
    "type": "Ready",
    "status": "True",
    "reason": "KubeletReady",
    "lastHeartbeatTime": "2026-01-01T00:00:00Z",
    "lastTransitionTime": "2026-01-01T00:00:00Z",
}


def gpu_template(
    group: str,
    shape: GpuShape,
    *,
    labels: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, str]] = (),
    min_count: int = 0,
    max_count: int = 4,
) -> dict[str, Any]:
    """A cluster-autoscaler kwok template Node for a group of ``shape`` GPU nodes.

    It is ``gpushare.kube.objects.gpu_node`` (the node as gpushare's device plugin leaves it:
    gpu-mem and gpu-count in capacity and allocatable, the inventory and unit annotations, the
    ``ack.node.gpu.schedule=share`` label) without the hostname label, with the group label,
    ``labels``, ``taints``, the group's size bounds and a Ready condition (no kubelet writes one
    before kwok takes the node over)."""
    node = gpu_node(
        group,
        gpus_units=[shape.units_per_gpu] * shape.gpus,
        mode=Mode.SHARE,
        unit=shape.unit,
        model=shape.model,
    )
    return _template(node, group, labels, taints, min_count, max_count)


def cpu_template(
    group: str,
    *,
    labels: Mapping[str, str] | None = None,
    min_count: int = 0,
    max_count: int = 4,
) -> dict[str, Any]:
    """A cluster-autoscaler kwok template Node for a group without GPUs."""
    resources = {"cpu": "64", "memory": "256Gi", "pods": "110"}
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": group, "labels": {}, "annotations": {}},
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }
    return _template(node, group, labels, (), min_count, max_count)


def dra_template(
    group: str,
    *,
    labels: Mapping[str, str] | None = None,
    min_count: int = 0,
    max_count: int = 4,
) -> dict[str, Any]:
    """A cluster-autoscaler kwok template Node for a group of DRA nodes: labelled
    ``gpushare.io/allocation-mode=dra``, no ``aliyun.com/*`` resources (the device plugin
    refuses a DRA node, so kubelet reports none). Its GPUs are in its ResourceSlice, which the
    kwok provider's template cannot carry (``cloudprovider/kwok/kwok_nodegroups.go``
    ``TemplateNodeInfo`` gives no slices)."""
    resources = {"cpu": "32", "memory": "128Gi", "pods": "110"}
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": group,
            "labels": {LABEL_ALLOCATION_MODE: ALLOCATION_MODE_DRA},
            "annotations": {},
        },
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }
    return _template(node, group, labels, (), min_count, max_count)


def _template(
    node: dict[str, Any],
    group: str,
    labels: Mapping[str, str] | None,
    taints: Sequence[Mapping[str, str]],
    min_count: int,
    max_count: int,
) -> dict[str, Any]:
    meta = node["metadata"]
    meta["labels"].pop(HOSTNAME_LABEL, None)
    meta["labels"].update({GROUP_LABEL: group, "kubernetes.io/os": "linux", **(labels or {})})
    meta["labels"].setdefault("kubernetes.io/arch", "amd64")
    # the provider writes into the annotations map, which must exist (AUTOSCALERS.md 1b)
    meta["annotations"].update(
        {
            CA_MIN_ANNOTATION: str(min_count),
            CA_MAX_ANNOTATION: str(max_count),
            CA_DESIRED_ANNOTATION: str(min_count),
        }
    )
    if taints:
        node["spec"] = {"taints": [dict(t) for t in taints]}
    node["status"]["conditions"] = [dict(READY)]
    return node


def group_of(template: Mapping[str, Any]) -> str:
    """A template's node group (the value of its ``GROUP_LABEL``)."""
    return str(template["metadata"]["labels"][GROUP_LABEL])


def node_of_group(template: Mapping[str, Any], name: str) -> dict[str, Any]:
    """A Node of the template's group, as cluster-autoscaler's kwok provider creates one
    (``kwok_nodegroups.go`` ``IncreaseSize``): for a warm pool made before the autoscaler runs."""
    node: dict[str, Any] = json.loads(json.dumps(template))
    node["metadata"]["name"] = name
    node["metadata"]["annotations"].update(
        {KWOK_ANNOTATION: KWOK_VALUE, CA_GROUP_ANNOTATION: group_of(template)}
    )
    node.setdefault("spec", {})["providerID"] = f"kwok:{name}"
    return node


# -- nodes, as the API holds them -------------------------------------------------------------


def group_nodes(cluster: Cluster, group: str) -> list[dict[str, Any]]:
    """The cluster's nodes of ``group`` (by ``GROUP_LABEL``), oldest first."""
    items: list[dict[str, Any]] = cluster.kubectl_json(
        "get", "nodes", "-l", f"{GROUP_LABEL}={group}"
    )["items"]
    return sorted(items, key=lambda n: (n["metadata"]["creationTimestamp"], n["metadata"]["name"]))


def group_node_names(cluster: Cluster, group: str) -> list[str]:
    return [n["metadata"]["name"] for n in group_nodes(cluster, group)]


def node_ready(node: Mapping[str, Any]) -> bool:
    conditions = node.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def wait_group_size(
    cluster: Cluster,
    group: str,
    size: int,
    timeout: float,
    process: Process | None = None,
    *,
    ready: bool = True,
) -> list[dict[str, Any]]:
    """Wait until ``group`` has ``size`` nodes (Ready ones, with ``ready``); return them. A
    timeout fails with the autoscaler's log tail."""
    found: list[dict[str, Any]] = []

    def reached() -> bool:
        found[:] = group_nodes(cluster, group)
        return len([n for n in found if node_ready(n) or not ready]) == size

    wait_for(f"{size} node(s) in group {group}", reached, timeout, process)
    return found


def wait_bound(
    cluster: Cluster, namespace: str, name: str, timeout: float, process: Process | None = None
) -> str:
    """Wait until the pod is bound; return its node."""
    node = ""

    def bound() -> bool:
        nonlocal node
        pod = cluster.kubectl_json("get", "pod", "-n", namespace, name)
        node = pod["spec"].get("nodeName") or ""
        return bool(node)

    wait_for(f"pod {namespace}/{name} bound", bound, timeout, process)
    return node


def delete_group_nodes(cluster: Cluster, groups: Sequence[str]) -> None:
    """Delete every node of ``groups`` (what an autoscaler made, a warm pool)."""
    if groups:
        cluster.kubectl(
            "delete",
            "nodes",
            "-l",
            f"{GROUP_LABEL} in ({','.join(groups)})",
            "--wait=false",
            check=False,
        )


# -- kubelet's and the device plugin's part on the autoscalers' nodes -------------------------


@dataclass
class Publisher:
    """What :func:`publishing_gpus` did, by node: the moment it published the node's GPUs."""

    published: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def node_agent_patch(
    node: Mapping[str, Any], shape: GpuShape | None, *, clears_taint: str = ""
) -> dict[str, Any]:
    """The patch kubelet (the hostname label) and gpushare's device plugin (inventory, unit,
    model labels; with ``clears_taint``, removing the taint of that key, as a plugin that lifts
    a startup taint once it published) would make on ``node``; {} when nothing is left to do.
    Pure."""
    meta = node["metadata"]
    name = meta["name"]
    labels: dict[str, str | None] = {}
    annotations: dict[str, str] = {}
    if HOSTNAME_LABEL not in (meta.get("labels") or {}):
        labels[HOSTNAME_LABEL] = name
    if shape is not None:
        gpus = shape.inventory(name)
        wanted = {ANN_NODE_GPUS: inventory_annotation(gpus), ANN_NODE_UNIT: shape.unit.value}
        held = meta.get("annotations") or {}
        annotations = {k: v for k, v in wanted.items() if held.get(k) != v}
        model_labels: dict[str, str | None] = {
            **gpu_node_labels([g.model for g in gpus], [shape.gib * GIB_MIB] * shape.gpus),
            LABEL_NODE_GPUS_PUBLISHED: "true",  # as node.publishing writes with them
        }
        current = meta.get("labels") or {}
        labels.update({k: v for k, v in model_labels.items() if current.get(k) != v})
    patch: dict[str, Any] = {}
    if labels:
        patch["labels"] = labels
    if annotations:
        patch["annotations"] = annotations
    result: dict[str, Any] = {"metadata": patch} if patch else {}
    taints = (node.get("spec") or {}).get("taints") or []
    if clears_taint and any(t.get("key") == clears_taint for t in taints):
        # a merge patch replaces the whole list: the others are written back as they are
        result["spec"] = {"taints": [t for t in taints if t.get("key") != clears_taint]}
    return result


@contextlib.contextmanager
def publishing_gpus(
    cluster: Cluster,
    shapes: Mapping[str, GpuShape | None],
    *,
    delay_s: float = 0.0,
    period_s: float = 1.0,
    clears_taint: str = "",
) -> Iterator[Publisher]:
    """Play kubelet's and the device plugin's publishing part on the nodes of ``shapes``' groups
    (``GROUP_LABEL`` value to the shape its device plugin finds; None: a node without GPUs),
    ``delay_s`` after each node appeared, until the block ends (module docstring). With
    ``clears_taint`` it also removes the taint of that key when it publishes (a startup taint
    that the device plugin lifts; only on nodes with a shape)."""
    done = Publisher()
    stop = threading.Event()
    first_seen: dict[str, float] = {}
    selector = f"{GROUP_LABEL} in ({','.join(shapes)})"

    def loop() -> None:
        while not stop.wait(period_s):
            try:
                items = cluster.kubectl_json("get", "nodes", "-l", selector)["items"]
            except Exception as err:  # a busy apiserver: next round
                done.errors.append(f"{type(err).__name__}: {err}")
                continue
            for node in items:
                name = node["metadata"]["name"]
                seen = first_seen.setdefault(name, time.monotonic())
                if time.monotonic() - seen < delay_s:
                    continue
                shape = shapes[node["metadata"]["labels"][GROUP_LABEL]]
                patch = node_agent_patch(
                    node, shape, clears_taint=clears_taint if shape is not None else ""
                )
                if patch:
                    cluster.kubectl(
                        "patch", "node", name, "--type=merge", "-p", json.dumps(patch), check=False
                    )
                done.published.setdefault(name, time.monotonic())

    thread = threading.Thread(target=loop, name="publishing-gpus", daemon=True)
    thread.start()
    try:
        yield done
    finally:
        stop.set()
        thread.join(timeout=30)


# -- cluster-autoscaler -----------------------------------------------------------------------


def ca_provider_config() -> dict[str, Any]:
    """The kwok provider's config: templates from a ConfigMap, grouped by ``GROUP_LABEL``, no
    ``kwok-provider`` taint (AUTOSCALERS.md 1b; ``cloudprovider/kwok/kwok_config.go``)."""
    return {
        "apiVersion": "v1alpha1",
        "readNodesFrom": "configmap",
        "nodegroups": {"fromNodeLabelKey": GROUP_LABEL},
        "nodes": {"skipTaint": True},
        "configmap": {"name": "kwok-provider-templates"},
    }


CA_FLAGS = (
    "--scan-interval=2s",
    "--max-node-provision-time=2m",
    "--scale-down-enabled=false",
    "--expander=least-waste",
    "--max-nodes-total=40",
)
"""Defaults for a test: a loop every 2 s, no scale-down (a test that wants it passes
``--scale-down-enabled=true`` and the ``--scale-down-*`` timings in ``flags``, which come
later on the command line and win)."""


@dataclass
class ClusterAutoscaler:
    """A running cluster-autoscaler and what a test reads of it."""

    cluster: Cluster
    process: Process
    namespace: str
    templates: list[dict[str, Any]]

    @property
    def groups(self) -> list[str]:
        return [group_of(t) for t in self.templates]

    def scale_ups(self) -> list[tuple[str, int]]:
        """Each scale-up it executed, from its log: (group, new size)."""
        text = self.process.log.read_text(errors="replace") if self.process.log.exists() else ""
        return [(m.group(1), int(m.group(2))) for m in SCALE_UP.finditer(text)]

    def log_lines(self, pattern: str) -> list[str]:
        """Its log lines matching the regular expression ``pattern``."""
        text = self.process.log.read_text(errors="replace") if self.process.log.exists() else ""
        found = re.compile(pattern)
        return [line for line in text.splitlines() if found.search(line)]

    def tail(self, lines: int = 60) -> str:
        return self.process.tail(lines)

    def nodes(self, group: str) -> list[dict[str, Any]]:
        return group_nodes(self.cluster, group)

    def wait_loops(self, loops: int, timeout: float = 60) -> None:
        """Wait until it has run ``loops`` more main loops (its ``Starting main loop`` lines)."""
        start = len(self.log_lines("Starting main loop"))
        wait_for(
            f"{loops} cluster-autoscaler loops",
            lambda: len(self.log_lines("Starting main loop")) >= start + loops,
            timeout,
            self.process,
        )


@contextlib.contextmanager
def running_cluster_autoscaler(
    cluster: Cluster,
    binaries: Mapping[str, Path],
    templates: Sequence[Mapping[str, Any]],
    *,
    name: str = "cluster-autoscaler",
    flags: Sequence[str] = (),
    verbosity: int = 4,
) -> Iterator[ClusterAutoscaler]:
    """Run cluster-autoscaler's kwok provider with these template Nodes as its node groups.

    Its ConfigMaps live in a namespace of its own (``name``), its log is
    ``<cluster>/logs/<name>.log``; ``flags`` are added after ``CA_FLAGS``. On leaving, it is
    stopped, and the nodes of its groups and its namespace are deleted."""
    namespace = name
    cluster.create_namespace(namespace, check=False)
    config = yaml.safe_dump(ca_provider_config())
    body = {"apiVersion": "v1", "kind": "List", "items": list(templates)}
    for map_name, key, text in (
        ("kwok-provider-config", "config", config),
        ("kwok-provider-templates", "templates", json.dumps(body)),
    ):
        manifest = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": map_name, "namespace": namespace},
            "data": {key: text},
        }
        cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    port = free_port()
    argv = [
        str(binaries[CA_BINARY]),
        "--cloud-provider=kwok",
        f"--kubeconfig={cluster.kubeconfig}",
        f"--namespace={namespace}",
        "--leader-elect=false",
        f"--address=127.0.0.1:{port}",
        "--logtostderr",
        f"--v={verbosity}",
        *CA_FLAGS,
        *flags,
    ]
    env = {**cluster.env(), "KWOK_PROVIDER_MODE": "local", "POD_NAMESPACE": namespace}
    process = Process(name, argv, cluster.root / "logs" / f"{name}.log")
    process.start(env)
    autoscaler = ClusterAutoscaler(cluster, process, namespace, [dict(t) for t in templates])
    try:
        wait_for(
            "cluster-autoscaler's first loop",
            lambda: bool(autoscaler.log_lines("Starting main loop")),
            60,
            process,
        )
        yield autoscaler
    finally:
        process.stop(grace=10)
        delete_group_nodes(cluster, autoscaler.groups)
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


# -- Karpenter --------------------------------------------------------------------------------

KWOK_NODE_CLASS = "gpushare-e2e"
ZONE = "test-zone-a"


def instance_type(
    name: str,
    *,
    cpu: str = "64",
    memory: str = "256Gi",
    extra: Mapping[str, str] | None = None,
    price: float = 1.0,
) -> dict[str, Any]:
    """One entry of Karpenter's kwok instance-types file (``kwok/cloudprovider/helpers.go``
    ``InstanceTypeOptions``): one on-demand offering in ``ZONE``; ``extra`` resources go beside
    cpu, memory and pods into the Node's allocatable."""
    return {
        "name": name,
        "offerings": [
            {
                "Price": price,
                "Available": True,
                "Requirements": [
                    {
                        "key": "karpenter.sh/capacity-type",
                        "operator": "In",
                        "values": ["on-demand"],
                    },
                    {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [ZONE]},
                ],
            }
        ],
        "architecture": "amd64",
        "operatingSystems": ["linux"],
        "resources": {"cpu": cpu, "memory": memory, "pods": "110", **(extra or {})},
    }


def gpu_instance_type(name: str, shape: GpuShape, *, price: float = 1.0) -> dict[str, Any]:
    """An instance type with ``shape``'s GPUs as kubelet would report them after gpushare's
    device plugin registered: ``aliyun.com/gpu-mem`` and ``aliyun.com/gpu-count``."""
    extra = {"aliyun.com/gpu-mem": str(shape.gpu_mem), "aliyun.com/gpu-count": str(shape.gpus)}
    return instance_type(name, extra=extra, price=price)


def nodepool(
    name: str,
    instance_types: Sequence[str],
    *,
    labels: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, str]] = (),
    startup_taints: Sequence[Mapping[str, str]] = (),
    disruption: Mapping[str, Any] | None = None,
    limits: Mapping[str, str] | None = None,
    gpu: bool = True,
) -> dict[str, Any]:
    """A NodePool of the kwok NodeClass limited to ``instance_types``, its nodes labelled
    ``GROUP_LABEL=<name>`` (plus ``ack.node.gpu.schedule=share`` when ``gpu``) and ``labels``.
    Without ``disruption`` it never consolidates (a scale-up test's node stays)."""
    template_labels = {GROUP_LABEL: name, **({"ack.node.gpu.schedule": "share"} if gpu else {})}
    template_labels.update(labels or {})
    spec: dict[str, Any] = {
        "template": {
            "metadata": {"labels": template_labels},
            "spec": {
                "nodeClassRef": {
                    "group": "karpenter.kwok.sh",
                    "kind": "KWOKNodeClass",
                    "name": KWOK_NODE_CLASS,
                },
                "requirements": [
                    {
                        "key": "node.kubernetes.io/instance-type",
                        "operator": "In",
                        "values": list(instance_types),
                    }
                ],
                "expireAfter": "Never",
                **({"taints": [dict(t) for t in taints]} if taints else {}),
                **({"startupTaints": [dict(t) for t in startup_taints]} if startup_taints else {}),
            },
        },
        "disruption": dict(
            disruption or {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "Never"}
        ),
    }
    if limits:
        spec["limits"] = dict(limits)
    return {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": name},
        "spec": spec,
    }


@dataclass
class Karpenter:
    """A running Karpenter (kwok provider) and what a test reads of it."""

    cluster: Cluster
    process: Process
    nodepools: list[dict[str, Any]]

    @property
    def groups(self) -> list[str]:
        return [p["metadata"]["name"] for p in self.nodepools]

    def nodeclaims(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.cluster.kubectl_json("get", "nodeclaims")["items"]
        return items

    def log_lines(self, pattern: str) -> list[str]:
        text = self.process.log.read_text(errors="replace") if self.process.log.exists() else ""
        found = re.compile(pattern)
        return [line for line in text.splitlines() if found.search(line)]

    def tail(self, lines: int = 60) -> str:
        return self.process.tail(lines)

    def nodes(self, group: str) -> list[dict[str, Any]]:
        return group_nodes(self.cluster, group)


def apply_karpenter_crds(cluster: Cluster, binaries: Mapping[str, Path]) -> None:
    """Apply Karpenter's CRDs (from its module, copied by autoscalers.sh) and wait until they
    are served."""
    crds = sorted(binaries["crds"].glob("*.yaml"))
    for crd in crds:
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
    for crd in crds:
        name = yaml.safe_load(crd.read_text())["metadata"]["name"]
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")


@contextlib.contextmanager
def running_karpenter(
    cluster: Cluster,
    binaries: Mapping[str, Path],
    instance_types: Sequence[Mapping[str, Any]],
    nodepools: Sequence[Mapping[str, Any]],
    *,
    name: str = "karpenter",
    flags: Sequence[str] = (),
    feature_gates: str = "",
) -> Iterator[Karpenter]:
    """Run Karpenter's kwok controller with these instance types and NodePools.

    The CRDs are applied, the ``KWOKNodeClass`` is created and marked Ready (no controller of
    the kwok provider does: the NodePool readiness controller waits for it), no leader election,
    no webhooks (Karpenter 1.x has none), batching of 1 s idle / 2 s at most. On leaving, it is
    stopped, and its NodePools, NodeClaims and nodes are deleted."""
    apply_karpenter_crds(cluster, binaries)
    node_class = {
        "apiVersion": "karpenter.kwok.sh/v1alpha1",
        "kind": "KWOKNodeClass",
        "metadata": {"name": KWOK_NODE_CLASS},
        "spec": {},
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(node_class))
    ready = {
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "Ready",
                    "message": "",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                    "observedGeneration": 1,
                }
            ]
        }
    }
    cluster.kubectl(
        "patch",
        "kwoknodeclass",
        KWOK_NODE_CLASS,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(ready),
    )
    types_file = cluster.root / f"{name}-instance-types.json"
    types_file.write_text(json.dumps(list(instance_types), indent=1))
    pools = [dict(p) for p in nodepools]
    cluster.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": pools})
    )
    metrics, health = free_port(), free_port()
    argv = [
        str(binaries[KARPENTER_BINARY]),
        f"--instance-types-file-path={types_file}",
        "--disable-leader-election",
        f"--metrics-port={metrics}",
        f"--health-probe-port={health}",
        "--batch-idle-duration=1s",
        "--batch-max-duration=2s",
        "--log-level=debug",
        *([f"--feature-gates={feature_gates}"] if feature_gates else []),
        *flags,
    ]
    env = {**cluster.env(), "KUBECONFIG": str(cluster.kubeconfig)}
    process = Process(name, argv, cluster.root / "logs" / f"{name}.log")
    process.start(env)
    karpenter = Karpenter(cluster, process, pools)
    try:
        wait_for(
            "Karpenter /readyz",
            lambda: Cluster._http_ok(f"http://127.0.0.1:{health}/readyz"),
            60,
            process,
        )
        yield karpenter
    finally:
        with contextlib.suppress(Exception):
            # NodeClaims before their NodePools: Karpenter drains and deletes each node while its
            # pool still exists (the other order leaves it retrying "NodePool not found")
            _drop_karpenter_nodes(cluster, karpenter.groups, process)
            for pool in karpenter.groups:
                cluster.kubectl("delete", "nodepool", pool, "--wait=false", check=False)
        process.stop(grace=10)
        delete_group_nodes(cluster, karpenter.groups)


def _drop_karpenter_nodes(cluster: Cluster, groups: Sequence[str], process: Process) -> None:
    """Delete the NodeClaims of ``groups`` while Karpenter still runs (it removes their
    finalizers and nodes), then clear any finalizer it left."""
    selector = f"{KARPENTER_NODEPOOL_LABEL} in ({','.join(groups)})"
    cluster.kubectl("delete", "nodeclaims", "-l", selector, "--wait=false", check=False)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and process.alive():
        left = cluster.kubectl_json("get", "nodeclaims", "-l", selector)["items"]
        if not left:
            return
        time.sleep(0.5)
    for kind in ("nodeclaims", "nodes"):
        for item in cluster.kubectl_json("get", kind, "-l", selector)["items"]:
            cluster.kubectl(
                "patch",
                kind,
                item["metadata"]["name"],
                "--type=merge",
                "-p",
                '{"metadata":{"finalizers":null}}',
                check=False,
            )


def timed(what: str, started: float, say: Callable[[str], None] = print) -> float:
    """Print and return the seconds since ``started`` (time.monotonic())."""
    took = time.monotonic() - started
    say(f"[autoscaling] {what}: {took:.1f}s")
    return took
