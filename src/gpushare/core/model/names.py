"""Wire names: resources, labels and annotations, spelled exactly as users and tools expect.

The resource names are a value (``ResourceNames``) rather than bare constants so a cluster that
prefers its own domain can rename them in one place; the defaults are ACK's.
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEDULER_NAME = "ack-co-scheduler"
DEFAULT_SCHEDULER = "default-scheduler"
"""What the API server writes into an empty ``spec.schedulerName`` (before admission)."""

LABEL_MODE = "ack.node.gpu.schedule"
LABEL_PLACEMENT = "ack.node.gpu.placement"

# Pod label asking for multi-GPU sharing (the pod's memory is split evenly over N GPUs).
LABEL_POD_GPU_COUNT = "aliyun.com/gpu-count"

# The predecessor's hand-off annotations (gpushare-scheduler-extender / device plugin).
ANN_IDX = "ALIYUN_COM_GPU_MEM_IDX"
ANN_POD = "ALIYUN_COM_GPU_MEM_POD"
ANN_DEV = "ALIYUN_COM_GPU_MEM_DEV"
ANN_ASSIGNED = "ALIYUN_COM_GPU_MEM_ASSIGNED"
ANN_ASSUME_TIME = "ALIYUN_COM_GPU_MEM_ASSUME_TIME"

# gpushare's own annotations.
ANN_ALLOCATION = "gpushare.io/allocation"
"""Pod: the full per-container, per-GPU allocation with its unit (JSON, see
core.records.allocation)."""
ANN_SEAL = "gpushare.io/seal"
"""Pod: HMAC-SHA256 of the allocation record, the pod's UID, namespace, name and node (see
core.records.trust); only an allocation whose seal verifies counts, so a tenant cannot forge one."""
ANN_NODE_GPUS = "gpushare.io/gpus"
"""Node: per-GPU inventory written by the device plugin (JSON list, see core.model.inventory)."""
LABEL_NODE_GPUS_PUBLISHED = "gpushare.io/gpus-published"
"""Node label: ``"true"`` once gpushare's device plugin published the node's GPUs (with the
inventory). Placeholders for Karpenter ask ``DoesNotExist`` of it: a node Karpenter plans has
none (core.autoscaling.placeholders)."""
ANN_NODE_UNIT = "gpushare.io/gpu-mem-unit"
"""Node: the memory unit its device plugin advertises (``1GiB`` or ``128MiB``)."""
ANN_NODE_GPUS_DISABLED = "gpushare.io/gpus-disabled"
"""Node: GPU indexes an operator took out of service (``1,3``, see core.model.disabling)."""
ANN_NODE_TOPOLOGY = "gpushare.io/gpu-topology"
"""Node: links between its GPUs, written by the device plugin (versioned JSON,
core.model.topology)."""
ANN_NODE_HANDOFF = "gpushare.io/handoff"
"""Node: ``podresources`` when gpushare's device plugin serves it and keeps the hand-off
invariant (see core.records.handoff); the extender then places pods so that Allocate is
unambiguous."""
HANDOFF_PODRESOURCES = "podresources"
ANN_NODE_GPU_USED = "gpushare.io/gpu-used"
"""Node: GPU memory in use per GPU as the device plugin last read it, with the time (JSON, see
core.records.gpuuse); written on cgpu and core_mem nodes, rarely."""
ANN_RETRY = "gpushare.io/retry"
"""Pod: when the extender last asked kube-scheduler to try the pod again (UTC, RFC 3339),
because GPUs came back after it refused the pod for want of them (see core.booking.waiting). Only
the update counts; bind neither reads nor clears it."""

ANN_REFUSAL_REPORTED = "gpushare.io/refusal-reported"
"""Pod: when the extender reported that kubelet refused it (UTC, RFC 3339): a ``RefusedByKubelet``
event was written, and an extender started later does not write it again (see
extender.readmitting)."""


POD_ANNOTATIONS = (
    ANN_ALLOCATION,
    ANN_SEAL,
    ANN_IDX,
    ANN_POD,
    ANN_DEV,
    ANN_ASSIGNED,
    ANN_ASSUME_TIME,
)
"""Every annotation bind writes on a pod (and removes again when binding fails)."""


@dataclass(frozen=True)
class ResourceNames:
    """Extended-resource names; defaults follow ACK so seed manifests run unchanged."""

    mem: str = "aliyun.com/gpu-mem"
    core: str = "aliyun.com/gpu-core.percentage"
    count: str = "aliyun.com/gpu-count"


DEFAULT_NAMES = ResourceNames()


# DRA mode (docs/dra.md): the same contract through Dynamic Resource Allocation.
DRA_DRIVER = "gpushare.io"
"""The DRA driver's name: ResourceSlices' ``spec.driver``, allocation results' ``driver``, and the
domain of the device attributes (``gpushare.io/uuid``)."""
DRA_DEVICE_CLASS = "gpu.gpushare.io"
"""The DeviceClass every gpushare claim names; it selects devices of ``DRA_DRIVER``."""
DRA_CAPACITY_MEMORY = "memory"
"""Consumable capacity: GPU memory, in steps of the node's unit (1Gi or 128Mi)."""
DRA_CAPACITY_CORES = "cores"
"""Consumable capacity: computing power in percent of the GPU (0-100, steps of 5, ACK's
``aliyun.com/gpu-core.percentage``)."""
LABEL_ALLOCATION_MODE = "gpushare.io/allocation-mode"
"""Node label: ``dra`` puts a node in DRA mode (the DRA driver serves it, the device plugin
refuses it); absent or ``device-plugin``: the device plugin serves it. A node is in one mode."""
ALLOCATION_MODE_DRA = "dra"
ALLOCATION_MODE_DEVICE_PLUGIN = "device-plugin"
DRA_CLAIM_NAME = "gpushare"
"""``pod.spec.resourceClaims[].name`` the webhook gives the claim it makes from ACK resources."""
DRA_SCHEDULING_GATE = "gpushare.io/dra-allocation"
"""Scheduling gate the webhook puts on a pod it converted; gpushare's DRA allocator removes it once
it has allocated the pod's claim (or found none fits, so the scheduler and the autoscaler see the
pod)."""
ANN_DRA_REQUESTS = "gpushare.io/dra-requests"
"""Pod: the ACK resources the webhook converted into a claim (JSON, see core.dra.claims), so
inspect and users still see what the manifest asked."""
