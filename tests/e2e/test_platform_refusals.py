"""The device plugin refused beside a platform's own plugin, with that platform's switch.

kwok nodes shaped as each platform writes them (tests/support/platform_nodes.py), each offering
``nvidia.com/gpu`` in ``status.allocatable`` as the platform's plugin makes kubelet do, and
gpushare's device plugin started against each with ``--fake-gpus``, as a process on the real
API server: it must exit before serving anything, its message naming the switch of that
platform (before: the GPU Operator's label alone, on every platform). Gap 5 (b) of the
platform notes.
"""

from __future__ import annotations

import copy
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from harness.cluster import Cluster
from harness.seeding import KWOK_ANNOTATION, KWOK_VALUE
from tests.support.e2e import delete_nodes
from tests.support.platform_nodes import AKS, BOTTLEROCKET, EKS_AL2023, GKE

CASES = [
    (EKS_AL2023, "eksctl create nodegroup --install-nvidia-plugin=false"),
    (GKE, "gke-no-default-nvidia-gpu-device-plugin=true"),
    (AKS, "--gpu-driver none"),
    (BOTTLEROCKET, "settings.kubelet-device-plugins.nvidia.enabled = false"),
]


def _kwok(shape: dict[str, Any], name: str) -> dict[str, Any]:
    node = copy.deepcopy(shape)
    node["metadata"]["name"] = name
    node["metadata"]["labels"]["kubernetes.io/hostname"] = name
    node["metadata"].setdefault("annotations", {})[KWOK_ANNOTATION] = KWOK_VALUE
    node["status"]["capacity"] = dict(node["status"]["allocatable"])
    return node


def _plugin(cluster: Cluster, node: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    command = [
        str(Path(sys.executable).parent / "gpushare"), "device-plugin",
        "--node-name", node, "--fake-gpus", "1x15GiB",
        "--kubeconfig", str(cluster.kubeconfig),
        "--state-dir", str(tmp / "state"), "--device-plugin-dir", str(tmp / "dp"),
        "--pod-resources-socket", str(tmp / "none.sock"),
        "--kubelet-config", str(tmp / "none"), "--cpu-manager-state", str(tmp / "none"),
        "--isolation", "none", "--device-list-strategy", "envvar",
        "--insecure-no-seal", "--metrics-port", "0", "--health-port", "0",
    ]  # fmt: skip
    return subprocess.run(
        command,
        env=cluster.env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.e2e
@pytest.mark.parametrize(("shape", "switch"), CASES, ids=["eks", "gke", "aks", "bottlerocket"])
def test_the_plugin_refuses_beside_the_platforms_plugin_naming_its_switch(
    cluster: Cluster, tmp_path: Path, shape: dict[str, Any], switch: str
) -> None:
    name = f"{shape['metadata']['name'][:40]}-{uuid.uuid4().hex[:4]}"
    node = _kwok(shape, name)
    cluster.create_nodes([node])
    try:
        stored = cluster.kubectl_json("get", "node", name)
        if stored["status"].get("allocatable", {}).get("nvidia.com/gpu") != "1":
            cluster.kubectl(
                "patch", "node", name, "--subresource=status", "--type=merge", "-p",
                '{"status": {"allocatable": {"nvidia.com/gpu": "1"}, '
                '"capacity": {"nvidia.com/gpu": "1"}}}',
            )  # fmt: skip
        done = _plugin(cluster, name, tmp_path)
        message = done.stdout + done.stderr
        assert done.returncode != 0, message
        assert f"node {name} already offers nvidia.com/gpu=1" in message, message
        assert switch in message, message
        print(message.strip().splitlines()[-1])
    finally:
        delete_nodes(cluster, [name])
