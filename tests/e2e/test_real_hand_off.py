"""A runtime that ignores the hand-off, on the real node: containerd 2 with ``enable_cdi = false``
(PLATFORMS.md C5 and gap 4; issue 59, "no silent GPU-less pod").

Before the hand-off check, the device plugin starts there and a GPU pod runs with no device
node: the runtime drops the CDI names kubelet passes on, and nothing fails. With it, the plugin
asks containerd through CRI (verbose ``Status``) at start and refuses, naming ``enable_cdi`` and
the ``envvar`` alternative; turned on again, containerd reports ``enableCDI`` and the plugin
starts, saying what it found.

``GPUSHARE_E2E_PLUGIN_BEFORE_CHECK=1`` runs the first test with a plugin from before the check
(no ``--hand-off-check``/``--cri-socket`` flags), to record the old behaviour.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator

import pytest

from harness.cluster import Cluster
from harness.realnode import RealNode, container, pod, probe_env
from tests.support.e2e import eventually, hold_real_node
from tests.support.realnode import NS, fresh_namespace, statuses

BEFORE = os.environ.get("GPUSHARE_E2E_PLUGIN_BEFORE_CHECK") == "1"


@pytest.fixture(scope="module")
def cdi_off(cluster: Cluster) -> Iterator[RealNode]:
    yield from hold_real_node(
        cluster, enable_cdi=False, plugin=False, hand_off_check="" if BEFORE else "refuse"
    )


def plugin_log(node: RealNode) -> str:
    log = node.cluster.root / "logs" / "gpushare-device-plugin.log"
    return log.read_bytes()[node._plugin_log_offset :].decode(errors="replace")


def test_without_the_check_a_gpu_pod_runs_with_no_device_node(cdi_off: RealNode) -> None:
    cluster = cdi_off.cluster
    cdi_off.start_plugin(extra=() if BEFORE else ("--hand-off-check", "off"))
    cdi_off.wait_capacity()
    fresh_namespace(cluster)
    try:
        cluster.kubectl(
            "apply", "-f", "-", input=json.dumps(pod("gpu", NS, [container("main", 1)]))
        )
        item = eventually(
            lambda: next(
                (
                    p
                    for p in cluster.kubectl_json("get", "pods", "-n", NS)["items"]
                    if p["status"].get("phase") in ("Succeeded", "Failed")
                ),
                None,
            ),
            120,
            "the GPU pod finished",
        )
        message = statuses(item)["main"]["state"]["terminated"]["message"]
        seen = probe_env(message)
        print(f"[hand-off] pod phase {item['status']['phase']}; probe saw:\n{message}")
        assert item["status"]["phase"] == "Succeeded"
        assert seen["ALIYUN_COM_GPU_MEM_CONTAINER"] == "1"
        assert seen["NVIDIA_VISIBLE_DEVICES"] == "void"  # cdi-cri: the GPU comes only by CDI
        assert seen["PROBE_DEVICES"] == ""  # ... and containerd dropped it: no /dev/nvidia*
        assert seen["PROBE_CDI_ENV"] == ""
    finally:
        cluster.kubectl("delete", "namespace", NS, "--wait=true", timeout=300, check=False)
        cdi_off.kill("gpushare-device-plugin")


@pytest.mark.skipif(BEFORE, reason="the plugin from before the check has no check")
def test_the_plugin_refuses_to_start_then_starts_once_cdi_is_on(cdi_off: RealNode) -> None:
    process = cdi_off.start_plugin()
    deadline = time.monotonic() + 60
    while process.alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not process.alive(), "the plugin kept running on a node whose runtime ignores CDI"
    assert process.popen is not None and process.popen.returncode == 2
    refused = plugin_log(cdi_off)
    print(f"[hand-off] the plugin's refusal:\n{refused}")
    assert "error: device-list strategy cdi-cri, but the container runtime ignores CDI" in refused
    assert "containerd v2.2.9 runs with enable_cdi = false" in refused
    assert "devicePlugin.deviceListStrategy=envvar" in refused
    assert "phase=register" not in refused

    cdi_off.enable_cdi = True
    cdi_off.start_containerd()
    cdi_off.start_plugin()
    cdi_off.wait_capacity()
    started = plugin_log(cdi_off)
    line = next(x for x in started.splitlines() if "phase=hand-off-check" in x)
    print(f"[hand-off] {line}")
    assert "applied: containerd v2.2.9: enable_cdi = true" in line
    assert str(cdi_off.cdi_dir) in line
