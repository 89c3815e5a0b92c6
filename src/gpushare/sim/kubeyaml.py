"""Reading Kubernetes manifests as a simulator workload: Nodes, and Pods / Jobs / Deployments.

People who want to know how gpushare would place *their* workload have manifests, not openb
CSV. This reader turns them into the same ``TraceNode`` / ``TracePod`` values, so both
accountings replay them unchanged. A file (multi-document YAML, JSON, or ``kind: List``) or a
directory of them is accepted; the CSV or YAML choice is made by content (``is_kubernetes_yaml``).

Nodes: ``cpu`` and ``memory`` from allocatable (else capacity); the GPU count from gpushare's
``gpushare.io/gpus`` annotation, else ``nvidia.com/gpu`` or ``aliyun.com/gpu-count``; the
card's memory from that annotation or ``aliyun.com/gpu-mem`` capacity (in the node's unit),
else the label ``nvidia.com/gpu.memory`` (MiB), else the model's entry in ``cards``; the model
from ``aliyun.accelerator/nvidia_name`` or ``nvidia.com/gpu.product``; the mode label is kept.

Pods: a Pod is one pod, a Job ``min(parallelism, completions)`` (whichever is given, else 1), a
Deployment, StatefulSet or ReplicaSet ``replicas`` (default 1); other kinds are skipped. CPU and
memory are counted as the extender counts them (``core.model.hostresources.pod_amount``: requests,
or
limits when no request, as Kubernetes defaults them; app containers and sidecars add up, an init
container needs its own amount beside the sidecars started before it; pod-level requests replace
the containers' sum; plus the pod's overhead), and quantities are read with the core's own
grammar (``core.model.quantity``). GPU requests are
validated by the core's own reader, so a manifest the extender would reject is rejected here
with the same sentence. ``nvidia.com/gpu: N`` is N whole GPUs. ``aliyun.com/gpu-mem`` (with
``aliyun.com/gpu-count``) becomes the paper's share by this rule:

    gpu_milli = ceil(1000 x units per GPU / units of the smallest card the pod can run on)

where the card's units are its memory at the cluster unit rounded down (as the device plugin
counts them) and "can run on" means a model the pod's nodeSelector allows with at least that
much memory; asking for all of that card is one whole GPU (1000). 3 GiB on a 14 GiB T4 is 215.
The memory itself is kept on the pod, so the memory mode asks for exactly what was written.
A pod that fits no card at all is an error: it could never run, and the paper has no way to
say so.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import yaml

from gpushare.core.model.hostresources import pod_amount
from gpushare.core.model.inventory import read_node
from gpushare.core.model.names import ANN_NODE_GPUS, DEFAULT_NAMES, LABEL_MODE
from gpushare.core.model.quantity import Quantity, parse_quantity
from gpushare.core.model.requests import Rejection, read_pod
from gpushare.core.model.units import MemoryUnit
from gpushare.sim import cards, openb
from gpushare.sim.openb import MILLI_PER_GPU, TraceError, TraceNode, TracePod

MODEL_LABELS = ("aliyun.accelerator/nvidia_name", "nvidia.com/gpu.product")
"""Node labels naming the GPU model (Alibaba's, then NVIDIA GPU feature discovery's)."""

MEMORY_LABEL = "nvidia.com/gpu.memory"
"""NVIDIA GPU feature discovery's label: one card's memory in MiB."""

WHOLE_GPU = "nvidia.com/gpu"
"""The plain device plugin's resource: whole GPUs."""

REPLICATED = ("Deployment", "StatefulSet", "ReplicaSet")
SUFFIXES = ("*.yaml", "*.yml", "*.json")
_SNIFF = re.compile(r"^\s*(apiVersion|kind|items)\s*:", re.MULTILINE)
MIB = 1024 * 1024


class KubeYamlError(TraceError):
    """A manifest that cannot be simulated: names the file, document, field, value and fix."""


@dataclass(frozen=True)
class Document:
    """One object of a manifest file, with where it came from for messages."""

    file: str
    index: int
    """1 = the file's first document (items of a ``kind: List`` count as documents too)."""
    obj: Mapping[str, Any]

    @property
    def kind(self) -> str:
        return str(self.obj.get("kind") or "")

    @property
    def name(self) -> str:
        meta = self.obj.get("metadata") or {}
        return str(meta.get("name") or "") if isinstance(meta, Mapping) else ""

    def fail(self, field: str, value: object, rule: str) -> KubeYamlError:
        """An error naming this document, the field and its value."""
        return KubeYamlError(
            f"{self.file} document {self.index} ({self.kind or 'no kind'} "
            f"{self.name or 'without a name'}): {field}={value!r} {rule}"
        )


def is_kubernetes_yaml(path: Path) -> bool:
    """Whether a path holds manifests (a directory, YAML or JSON objects) rather than CSV."""
    if path.is_dir():
        return True
    try:
        with path.open(errors="replace") as handle:
            head = handle.read(65536)
    except OSError:
        return path.suffix in (".yaml", ".yml", ".json")
    return bool(_SNIFF.search(head)) or head.lstrip().startswith(("{", "---"))


def documents(path: Path) -> list[Document]:
    """Every object in a file, or in the YAML/JSON files of a directory (sorted by name)."""
    files = sorted({f for s in SUFFIXES for f in path.glob(s)}) if path.is_dir() else [path]
    if not files:
        raise KubeYamlError(f"{path}: directory holds no .yaml, .yml or .json file")
    out: list[Document] = []
    for file in files:
        try:
            text = file.read_text()
        except OSError as err:
            raise KubeYamlError(f"cannot open {file}: {err.strerror}") from None
        try:
            loaded = [d for d in yaml.safe_load_all(text) if d is not None]
        except yaml.YAMLError as err:
            raise KubeYamlError(f"{file.name}: not valid YAML: {err}") from None
        index = 0
        for doc in loaded:
            items = (
                doc.get("items") if isinstance(doc, Mapping) and doc.get("kind") == "List" else None
            )
            for obj in items if isinstance(items, list) else [doc]:
                index += 1
                if not isinstance(obj, Mapping):
                    raise KubeYamlError(
                        f"{file.name} document {index}: {obj!r} is not a Kubernetes object; "
                        f"every document must be a mapping with kind and metadata"
                    )
                out.append(Document(file.name, index, obj))
    return out


def quantity(doc: Document, field: str, value: object) -> Fraction:
    """A Kubernetes quantity (``500m``, ``64``, ``256Gi``, ``1e9``) as an exact number."""
    parsed = parse_quantity(value)
    if not isinstance(parsed, Quantity):
        raise doc.fail(
            field, value, "is not a Kubernetes quantity; write e.g. 8, 500m, 32Gi or 1e9"
        )
    if parsed.value < 0:
        raise doc.fail(field, value, "is negative; write an amount of 0 or more")
    return parsed.value


def _count(doc: Document, field: str, value: object) -> int:
    number = quantity(doc, field, value)
    if number.denominator != 1:
        raise doc.fail(field, value, "is fractional; GPUs are counted whole: write an integer")
    return int(number)


# -- nodes ---------------------------------------------------------------------------------


def read_nodes(path: Path, *, unit: MemoryUnit = MemoryUnit.GiB) -> list[TraceNode]:
    """The Node objects in a manifest file or directory, in order."""
    nodes = [_node(doc, unit) for doc in documents(path) if doc.kind == "Node"]
    if not nodes:
        raise KubeYamlError(f"{path}: holds no kind: Node object; give the cluster's nodes")
    return nodes


def _node(doc: Document, unit: MemoryUnit) -> TraceNode:
    status = doc.obj.get("status") or {}
    resources = {**(status.get("capacity") or {}), **(status.get("allocatable") or {})}
    meta = doc.obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    for key in ("cpu", "memory"):
        if key not in resources:
            raise doc.fail(
                f"status.allocatable.{key}",
                None,
                f"is missing; the simulator checks pods' {key} requests against it: add it "
                "(or status.capacity)",
            )
    cpu_milli = int(quantity(doc, "status.allocatable.cpu", resources["cpu"]) * 1000)
    memory_mib = int(quantity(doc, "status.allocatable.memory", resources["memory"]) / MIB)
    model = next((str(labels[k]) for k in MODEL_LABELS if labels.get(k)), "")
    inventory = read_node(doc.obj, cluster_unit=unit)
    gpus, card_mib = 0, 0
    if ANN_NODE_GPUS in (meta.get("annotations") or {}):
        if inventory.problem:
            raise doc.fail(
                f"metadata.annotations[{ANN_NODE_GPUS!r}]",
                "...",
                f"is unreadable: {inventory.problem}",
            )
        gpus = len(inventory.gpus)
        card_mib = min(g.mem_units for g in inventory.gpus) * inventory.unit.mib
        model = model or next((g.model for g in inventory.gpus if g.model), "")
    else:
        for key in (WHOLE_GPU, DEFAULT_NAMES.count):
            if key in resources:
                gpus = _count(doc, f"status.allocatable[{key!r}]", resources[key])
                break
        if gpus and DEFAULT_NAMES.mem in resources:
            field = f"status.allocatable[{DEFAULT_NAMES.mem!r}]"
            units = _count(doc, field, resources[DEFAULT_NAMES.mem])
            card_mib = units // gpus * inventory.unit.mib  # the node's own unit, if it says
    if gpus and not card_mib:
        if labels.get(MEMORY_LABEL):
            card_mib = _count(doc, f"metadata.labels[{MEMORY_LABEL!r}]", labels[MEMORY_LABEL])
        else:
            card_mib = cards.memory_mib(model) or 0
    if gpus and not card_mib:
        raise doc.fail(
            f"metadata.labels[{MODEL_LABELS[0]!r}]",
            model or None,
            f"does not tell the card's memory; add capacity {DEFAULT_NAMES.mem} with "
            f"{DEFAULT_NAMES.count}, the label {MEMORY_LABEL} (MiB), or a model label naming "
            f"one of {cards.known_models()}",
        )
    return TraceNode(
        name=doc.name,
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
        gpus=gpus,
        model=model,
        gpu_mem_mib=card_mib,
        mode=str(labels.get(LABEL_MODE) or ""),
    )


# -- pods ----------------------------------------------------------------------------------


def read_pods(
    path: Path, nodes: Sequence[TraceNode], *, unit: MemoryUnit = MemoryUnit.GiB
) -> list[TracePod]:
    """The pods that the Pods and workloads in a manifest file or directory create."""
    pods: list[TracePod] = []
    for doc in documents(path):
        count = _replicas(doc)
        if count is None:
            continue
        template = _template(doc)
        pod = _pod(doc, template, nodes, unit)
        if doc.kind == "Pod":
            pods.append(pod)
        else:
            pods.extend(_renamed(pod, f"{pod.name}-{i}") for i in range(count))
    if not pods:
        raise KubeYamlError(
            f"{path}: holds no Pod, Job, Deployment, StatefulSet or ReplicaSet; give the "
            "workload's manifests"
        )
    return pods


def _renamed(pod: TracePod, name: str) -> TracePod:
    return TracePod(
        name,
        pod.cpu_milli,
        pod.memory_mib,
        pod.num_gpu,
        pod.gpu_milli,
        pod.gpu_spec,
        pod.gpu_mem_mib,
        pod.gpu_core_pct,
    )


def _replicas(doc: Document) -> int | None:
    """How many pods the object makes; None for kinds that make none."""
    spec = doc.obj.get("spec") or {}
    if doc.kind == "Pod":
        return 1
    if doc.kind == "Job":
        given = [
            (f"spec.{k}", spec[k])
            for k in ("parallelism", "completions")
            if spec.get(k) is not None
        ]
    elif doc.kind in REPLICATED:
        given = [("spec.replicas", spec.get("replicas", 1))]
    else:
        return None
    counts = []
    for field, value in given:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise doc.fail(field, value, "must be a whole number >= 0")
        counts.append(value)
    return min(counts, default=1)


def _template(doc: Document) -> Mapping[str, Any]:
    """The pod (or pod template) as a Pod object the core's reader takes."""
    if doc.kind == "Pod":
        return doc.obj
    template = (doc.obj.get("spec") or {}).get("template")
    if not isinstance(template, Mapping):
        raise doc.fail("spec.template", template, "is missing; a workload needs a pod template")
    meta = dict(template.get("metadata") or {})
    meta.setdefault("name", doc.name)
    meta.setdefault("namespace", (doc.obj.get("metadata") or {}).get("namespace"))
    return {"kind": "Pod", "metadata": meta, "spec": template.get("spec") or {}}


def _pod(
    doc: Document,
    pod: Mapping[str, Any],
    nodes: Sequence[TraceNode],
    unit: MemoryUnit,
) -> TracePod:
    prefix = "" if doc.kind == "Pod" else "spec.template."
    spec = pod.get("spec") or {}
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        raise doc.fail(f"{prefix}spec.containers", containers, "must list at least one container")
    cpu = _amount(doc, pod, prefix, "cpu", 1000)
    memory = math.ceil(Fraction(_amount(doc, pod, prefix, "memory", 1), MIB))
    whole = _amount(doc, pod, prefix, WHOLE_GPU, 1)
    request = read_pod(pod, unit=unit)
    if isinstance(request, Rejection):
        raise doc.fail(
            f"{prefix}spec",
            "...",
            "asks for GPU memory in a way the extender rejects: " + request.message,
        )
    selector = spec.get("nodeSelector") or {}
    spec_models = tuple(str(selector[k]) for k in MODEL_LABELS if selector.get(k))
    name = str((pod.get("metadata") or {}).get("name") or doc.name)
    if whole and request.wants_gpu:
        raise doc.fail(
            f"{prefix}spec.containers[*].resources.limits",
            {WHOLE_GPU: whole, DEFAULT_NAMES.mem: request.mem_units},
            f"asks for whole GPUs and a GPU share at once; keep {WHOLE_GPU} or {DEFAULT_NAMES.mem}",
        )
    if not request.wants_gpu:
        milli = MILLI_PER_GPU if whole else 0
        return TracePod(name, cpu, memory, whole, milli, spec_models)
    per_gpu = request.mem_per_gpu
    sizes = [
        card_units(n, unit)
        for n in nodes
        if n.gpus and (not spec_models or n.model in spec_models) and card_units(n, unit) >= per_gpu
    ]
    if not sizes:
        raise doc.fail(
            f"{prefix}spec.containers[*].resources.limits[{DEFAULT_NAMES.mem!r}]",
            request.mem_units,
            f"({unit.describe(per_gpu)} per GPU) fits no card of the cluster"
            + (f" with model {' or '.join(spec_models)}" if spec_models else "")
            + "; lower it, or add a node with a card that large",
        )
    smallest = min(sizes)
    milli = MILLI_PER_GPU if per_gpu >= smallest else math.ceil(MILLI_PER_GPU * per_gpu / smallest)
    return TracePod(
        name,
        cpu,
        memory,
        request.gpu_count,
        milli,
        spec_models,
        gpu_mem_mib=per_gpu * unit.mib,
        gpu_core_pct=request.core_per_gpu,
    )


def card_units(node: TraceNode, unit: MemoryUnit) -> int:
    """One card's memory in whole units, as the device plugin counts it (0 when unknown)."""
    mib = node.gpu_mem_mib or cards.memory_mib(node.model) or 0
    return mib // unit.mib


def _amount(doc: Document, pod: Mapping[str, Any], prefix: str, resource: str, scale: int) -> int:
    """The pod's amount of a resource as the extender counts it, scaled and rounded up.

    Every amount written is read first, so a bad one is an error naming its field rather than
    the nothing the extender's count takes it for (the API server would refuse that pod).
    """
    spec = pod.get("spec") or {}
    for kind in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(kind) or []):
            resources = (container or {}).get("resources") or {}
            for part in ("requests", "limits"):
                value = (resources.get(part) or {}).get(resource)
                if value is not None:
                    quantity(doc, f"{prefix}spec.{kind}[{i}].resources.{part}[{resource!r}]", value)
    for field, values in (
        ("spec.resources.requests", (spec.get("resources") or {}).get("requests") or {}),
        ("spec.overhead", spec.get("overhead") or {}),
    ):
        if values.get(resource) is not None:
            quantity(doc, f"{prefix}{field}[{resource!r}]", values[resource])
    return pod_amount(pod, resource, scale)


def read_workload(
    nodes_path: Path, pods_path: Path, *, unit: MemoryUnit = MemoryUnit.GiB
) -> tuple[list[TraceNode], list[TracePod]]:
    """Nodes and pods from openb CSV or manifests, each chosen by the file's content."""
    if is_kubernetes_yaml(nodes_path):
        nodes = read_nodes(nodes_path, unit=unit)
    else:
        nodes = openb.read_nodes(nodes_path)
    if is_kubernetes_yaml(pods_path):
        pods = read_pods(pods_path, nodes, unit=unit)
    else:
        pods = openb.read_pods(pods_path)
    return nodes, pods
