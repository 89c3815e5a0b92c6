"""Builders for the Kubernetes objects the demo, the tests and the simulator create.

A GPU node is written the way gpushare's device plugin leaves it: capacity and allocatable for
``aliyun.com/gpu-mem`` / ``gpu-count`` (and ``gpu-core.percentage`` on core_mem nodes), plus the
per-GPU inventory and unit annotations.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from gpushare.core.model.inventory import CORE_PER_GPU, Gpu, Mode, inventory_annotation
from gpushare.core.model.names import (
    ANN_ALLOCATION,
    ANN_NODE_GPUS,
    ANN_NODE_UNIT,
    ANN_SEAL,
    DEFAULT_NAMES,
    LABEL_MODE,
    LABEL_PLACEMENT,
    ResourceNames,
)
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.allocation import Allocation, to_annotations
from gpushare.core.records.trust import Trust
from gpushare.kube.port import KubeDict


def gpu_node(
    name: str,
    *,
    ip: str = "",
    gpus_units: Sequence[int] = (15,),
    mode: Mode | str | None = Mode.SHARE,
    placement: str | None = None,
    unit: MemoryUnit = MemoryUnit.GiB,
    model: str = "Tesla T4",
    unhealthy: Sequence[int] = (),
    names: ResourceNames = DEFAULT_NAMES,
) -> KubeDict:
    """A node as gpushare's device plugin describes it.

    ``mode`` is written as the ``ack.node.gpu.schedule`` label: a ``Mode``'s value, a label value
    as found in a manifest (gpushare may not know it), or None for no label.
    """
    gpus = tuple(
        Gpu(index=i, mem_units=m, healthy=i not in unhealthy, uuid=f"GPU-{name}-{i}", model=model)
        for i, m in enumerate(gpus_units)
    )
    resources: dict[str, str] = {
        names.mem: str(sum(g.mem_units for g in gpus if g.healthy)),
        names.count: str(len(gpus)),
        "cpu": "64",
        "memory": "256Gi",
        "pods": "110",
    }
    label = mode.value if isinstance(mode, Mode) else mode
    if Mode.from_label(label) is Mode.CORE_MEM:
        resources[names.core] = str(CORE_PER_GPU * len(gpus))
    labels: dict[str, str] = {"kubernetes.io/hostname": name}
    if label is not None:
        labels[LABEL_MODE] = label
    if placement is not None:
        labels[LABEL_PLACEMENT] = placement
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {
                ANN_NODE_GPUS: inventory_annotation(gpus),
                ANN_NODE_UNIT: unit.value,
            },
        },
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "addresses": [{"type": "InternalIP", "address": ip}] if ip else [],
        },
    }


def gpu_pod(
    name: str,
    *,
    mem: int | str | None = 1,
    core: int | str | None = None,
    namespace: str = "default",
    gpu_count: str | None = None,
    scheduler: str = "ack-co-scheduler",
    names: ResourceNames = DEFAULT_NAMES,
) -> KubeDict:
    """A one-container pod asking for GPU memory (and computing power)."""
    limits: dict[str, Any] = {}
    if mem is not None:
        limits[names.mem] = mem
    if core is not None:
        limits[names.core] = core
    labels = {"aliyun.com/gpu-count": gpu_count} if gpu_count is not None else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "schedulerName": scheduler,
            "containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}],
        },
    }


def placed(
    pod: Mapping[str, Any],
    allocation: Allocation,
    *,
    trust: Trust,
    dev_units: int = 15,
    bound: bool = True,
) -> KubeDict:
    """The pod as gpushare's bind leaves it: annotations, their seal, and bound to the node."""
    record = to_annotations(allocation, dev_units=dev_units)
    seal = trust.seal_for(allocation, record[ANN_ALLOCATION])
    metadata = {**pod.get("metadata", {}), "annotations": {**record, ANN_SEAL: seal}}
    spec = {**pod.get("spec", {}), **({"nodeName": allocation.node} if bound else {})}
    return {**pod, "metadata": metadata, "spec": spec}


def pod_from_job(job: Mapping[str, Any], *, index: int = 0) -> KubeDict:
    """The pod a Job controller would create (name ``<job>-<5 chars>``), deterministically."""
    meta = job.get("metadata") or {}
    job_name = str(meta.get("name", "job"))
    template = (job.get("spec") or {}).get("template") or {}
    suffix = hashlib.sha256(f"{job_name}/{index}".encode()).hexdigest()[:5]
    pod_meta = dict(template.get("metadata") or {})
    pod_meta.update(
        name=f"{job_name}-{suffix}",
        namespace=str(meta.get("namespace") or "default"),
        labels={**(pod_meta.get("labels") or {}), "job-name": job_name},
    )
    spec = dict(template.get("spec") or {})
    spec.setdefault("schedulerName", "default-scheduler")
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": spec}
