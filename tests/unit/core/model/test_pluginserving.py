"""Whether a node labelled for sharing has a device plugin serving it (the extender's
``gpushare_node_device_plugin_missing``, which the chart's GPUShareDevicePluginMissing reads)."""

from __future__ import annotations

from typing import Any

import pytest

from gpushare.core.model.inventory import Mode, read_node
from gpushare.core.model.names import ANN_NODE_GPUS, DEFAULT_NAMES
from gpushare.core.model.pluginserving import Missing, plugin_missing
from gpushare.kube.objects import gpu_node

MEM = DEFAULT_NAMES.mem


def without_plugin(node: dict[str, Any], *, published: bool) -> dict[str, Any]:
    """The node after its plugin went (kubelet's 0) or before it ever ran (no figure, no
    annotation)."""
    if published:
        node["status"]["allocatable"][MEM] = "0"
    else:
        del node["metadata"]["annotations"][ANN_NODE_GPUS]
        for part in ("capacity", "allocatable"):
            node["status"][part].pop(MEM)
    return node


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        (gpu_node("served"), None),
        (without_plugin(gpu_node("never"), published=False), Missing.UNPUBLISHED),
        (without_plugin(gpu_node("gone"), published=True), Missing.UNREGISTERED),
        (
            without_plugin(gpu_node("gone-cgpu", mode=Mode.CGPU), published=True),
            Missing.UNREGISTERED,
        ),
        # every GPU withdrawn: kubelet's 0 is the plugin serving unhealthy devices
        (gpu_node("sick", gpus_units=[15, 15], unhealthy=[0, 1]), None),
        # one healthy GPU left, yet nothing allocatable: no plugin registered
        (
            without_plugin(gpu_node("half", gpus_units=[15, 15], unhealthy=[1]), published=True),
            Missing.UNREGISTERED,
        ),
        # not shared: no label, or a mode gpushare does not share in
        (without_plugin(gpu_node("plain", mode=None), published=False), None),
        (without_plugin(gpu_node("exclusive", mode="exclusive"), published=False), None),
        # ACK's own plugin publishes no annotation, only kubelet's figure
        (
            {**gpu_node("ack"), "metadata": {**gpu_node("ack")["metadata"], "annotations": {}}},
            None,
        ),
    ],
    ids=lambda v: v["metadata"]["name"] if isinstance(v, dict) else str(v),
)
def test_a_labelled_node_without_a_serving_plugin_is_told_with_the_reason(
    node: dict[str, Any], expected: Missing | None
) -> None:
    assert plugin_missing(read_node(node)) is expected
