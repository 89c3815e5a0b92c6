"""Whether a node labelled for sharing has a device plugin serving it, from its inventory alone.

The most likely failure on a new platform is a device plugin that never serves its node: its
start refused (another plugin on the node, a read-only path, a missing CDI spec), its image not
pulled, its pod kept off the node by a taint it does not tolerate. Its own metrics cannot say
so: a plugin that does not run exports nothing, and an alert on a missing series needs the
series' labels first (kube-state-metrics has the DaemonSet's counts, not which node lacks its
pod, and node labels only through an allowlist). The extender watches every node already, so it
tells, per node labelled ``ack.node.gpu.schedule`` with a shared mode, whether kubelet offers
GPU memory there, and the chart's PrometheusRule alerts on the nodes where it does not for longer
than a grace period (new nodes take a few minutes to start their plugin).

kubelet offers ``aliyun.com/gpu-mem`` in ``status.allocatable`` only while a plugin is
registered for it with healthy devices, and drops it to 0 when the plugin goes; gpushare's
plugin also writes ``gpushare.io/gpus`` on its first start. So:

- allocatable memory > 0: a plugin serves (gpushare's, or ACK's own, which publishes no
  annotation);
- the annotation lists GPUs and every one is unhealthy: the plugin serves a node whose GPUs are
  all withdrawn, which kubelet shows as 0 too; the unhealthy-GPU alert covers it, not this one;
- otherwise, ``unregistered`` when the annotation is there (the plugin ran once and is not
  registered now: stopped, crash-looping, refused since) and ``unpublished`` when it is not (it
  never got as far as publishing on this node).
"""

from __future__ import annotations

from enum import Enum

from gpushare.core.model.inventory import Mode, NodeInventory


class Missing(Enum):
    """Why a labelled node has no plugin serving it."""

    UNPUBLISHED = "unpublished"
    """No ``gpushare.io/gpus`` annotation and no GPU memory allocatable: the plugin never
    published this node's GPUs."""
    UNREGISTERED = "unregistered"
    """The plugin published the GPUs once, but kubelet offers no GPU memory now."""


def plugin_missing(node: NodeInventory) -> Missing | None:
    """Why no device plugin serves this node; None when one does or the node is not shared."""
    if node.mode is Mode.NONE:
        return None
    if node.kubelet_mem_units is not None and node.kubelet_mem_units > 0:
        return None
    if not node.published:
        return Missing.UNPUBLISHED
    if node.gpus and not any(gpu.healthy for gpu in node.gpus):
        return None
    return Missing.UNREGISTERED
