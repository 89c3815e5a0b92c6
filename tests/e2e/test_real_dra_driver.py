"""The DRA driver on a real node: kubelet v1.36 (DRA on by default), containerd 2 with CDI, the
real API server validating the slice and the claims, the default scheduler allocating them.

The node runs no device plugin; it is labelled ``gpushare.io/allocation-mode=dra`` and
``gpushare dra-driver`` runs beside kubelet with the chart's ServiceAccount and RBAC
(``templates/dra-driver.yaml``). Claims are written by hand (the webhook that makes them from
ACK resources is another part), a DeviceClass selects the driver's devices, and each container
runs ``/probe``, which prints the environment the claim's CDI spec gave it and the fake GPUs'
device nodes the GPU's own CDI device (cdi-cri) gave it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.cluster import Cluster
from harness.images import TEST_IMAGE
from harness.realnode import NODE_NAME, TOLERATION, RealNode, hand_off, probe_env
from tests.support.dra import registered_times, start_driver
from tests.support.e2e import eventually, hold_real_node
from tests.support.realnode import create

NS = "e2e-dra-driver"
DRIVER = "gpushare.io"
CLASS = "gpu.gpushare.io"
LABEL = "gpushare.io/allocation-mode"


@pytest.fixture(scope="module")
def dra_node(cluster: Cluster) -> Iterator[RealNode]:
    """A real node with kubelet and containerd, no device plugin; the driver is started by the
    first test, which checks the refusals on the way."""
    for node in hold_real_node(cluster, plugin=False, fake_gpus="2x15GiB"):
        cluster.create_namespace(NS, check=False)
        device_class = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": CLASS},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
        }
        # the chart's DeviceClass (templates/dra-claims.yaml) has this name: made here only when
        # no test before made it, and then removed again
        made = cluster.kubectl("create", "-f", "-", input=json.dumps(device_class), check=False)
        try:
            yield node
        finally:
            cluster.kubectl("delete", "namespace", NS, "--ignore-not-found", "--wait=false")
            if made.returncode == 0:
                cluster.kubectl("delete", "deviceclass", CLASS, "--ignore-not-found")
            cluster.kubectl(
                "delete",
                "resourceslices",
                f"--field-selector=spec.nodeName={node.name}",
                "--ignore-not-found",
                check=False,
            )


def driver_log(node: RealNode) -> str:
    return (node.cluster.root / "logs" / "gpushare-dra-driver.log").read_text()


def slices(cluster: Cluster) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.kubectl_json(
        "get", "resourceslices", f"--field-selector=spec.nodeName={NODE_NAME}"
    )["items"]
    return items


def devices(cluster: Cluster) -> list[str]:
    found = slices(cluster)
    return [d["name"] for s in found for d in s["spec"].get("devices", [])]


def claim(name: str, requests: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": CLASS,
                            "allocationMode": "ExactCount",
                            "count": 1,
                            "capacity": {"requests": requests},
                        },
                    }
                ]
            }
        },
    }


def claimed_pod(name: str, claim_name: str) -> dict[str, Any]:
    """A pod on the real node using the claim, printing what it got, then sleeping."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE_NAME},
            "tolerations": [TOLERATION],
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
            "containers": [
                {
                    "name": "main",
                    "image": TEST_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/sh", "-c", "/probe; exec sleep 3600"],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }


def running_env(cluster: Cluster, pod: str) -> dict[str, str]:
    """The pod's /probe output once it runs; fails with its events when it does not."""

    def running() -> bool:
        item = cluster.kubectl_json("get", "pod", pod, "-n", NS)
        return bool(item.get("status", {}).get("phase") == "Running")

    try:
        eventually(running, timeout=90, what=f"pod {pod} Running")
    except AssertionError:
        events = cluster.kubectl("get", "events", "-n", NS, "-o", "wide", check=False).stdout
        raise AssertionError(f"pod {pod} did not run:\n{events}") from None
    text = eventually(
        lambda: cluster.kubectl("logs", pod, "-n", NS, check=False).stdout.strip(),
        timeout=30,
        what=f"{pod}'s log",
    )
    return probe_env(text)


def allocation(cluster: Cluster, name: str) -> dict[str, Any]:
    item = cluster.kubectl_json("get", "resourceclaim", name, "-n", NS)
    [result] = item["status"]["allocation"]["devices"]["results"]
    return dict(result)


def test_the_driver_refuses_a_node_not_labelled_for_dra_then_serves_it(dra_node: RealNode) -> None:
    cluster = dra_node.cluster
    process = dra_node.start_dra_driver()
    eventually(lambda: not process.alive(), timeout=60, what="the driver refuses")
    assert process.popen is not None and process.popen.returncode == 2
    assert f"{LABEL}=dra" in driver_log(dra_node)
    assert not devices(cluster)

    cluster.kubectl("label", "node", NODE_NAME, f"{LABEL}=dra", "--overwrite")
    # the device plugin refuses the node now
    plugin = dra_node.start_plugin()
    eventually(lambda: not plugin.alive(), timeout=60, what="the device plugin refuses")
    plugin_log = (cluster.root / "logs" / "gpushare-device-plugin.log").read_text()
    assert f"{LABEL}=dra: the DRA driver" in plugin_log

    start_driver(dra_node)
    [published] = eventually(lambda: slices(cluster), timeout=30, what="the slice")
    spec = published["spec"]
    assert (spec["driver"], spec["nodeName"], spec["pool"]["name"]) == (
        DRIVER,
        NODE_NAME,
        NODE_NAME,
    )
    assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-1"]
    memory = spec["devices"][0]["capacity"]["memory"]
    assert memory["value"] == "15Gi"
    assert memory["requestPolicy"]["validRange"]["step"] == "1Gi"
    assert spec["devices"][0]["allowMultipleAllocations"] is True


def test_two_claims_share_one_gpu_with_the_device_plugins_hand_off(dra_node: RealNode) -> None:
    cluster = dra_node.cluster
    create(cluster, [claim("c1", {"memory": "3Gi", "cores": "30"}), claimed_pod("p1", "c1")])
    env = running_env(cluster, "p1")
    result = allocation(cluster, "c1")
    assert result["consumedCapacity"] == {"memory": "3Gi", "cores": "30"}
    index = int(result["device"].removeprefix("gpu-"))
    uuid = dra_node.fake_gpus_list()[index].uuid
    assert env["ALIYUN_COM_GPU_MEM_CONTAINER"] == "3"
    assert env["ALIYUN_COM_GPU_MEM_DEV"] == "15"
    assert env["ALIYUN_COM_GPU_MEM_IDX"] == str(index)
    assert env["ALIYUN_COM_GPU_CORE_PERCENTAGE"] == "30"
    assert env["GPUSHARE_MEM_UNIT"] == "1GiB"
    # as Allocate hands it over (cdi-cri: the GPU's own CDI device, the variable void; envvar:
    # the variable names the GPU)
    uuids = {g.index: g.uuid for g in dra_node.fake_gpus_list()}
    wanted = hand_off([index], uuids, dra_node.device_list_strategy)
    assert {k: env[k] for k in wanted} == wanted
    if dra_node.device_list_strategy == "cdi-cri":
        assert (env["NVIDIA_VISIBLE_DEVICES"], env["PROBE_CDI_ENV"]) == ("void", f"{index}={uuid}")

    create(cluster, [claim("c2", {"memory": "5Gi"}), claimed_pod("p2", "c2")])
    env2 = running_env(cluster, "p2")
    second = allocation(cluster, "c2")
    assert second["device"] == result["device"]  # the stock allocator: first fit, shared
    assert second["consumedCapacity"]["memory"] == "5Gi"
    assert env2["ALIYUN_COM_GPU_MEM_CONTAINER"] == "5"
    assert "ALIYUN_COM_GPU_CORE_PERCENTAGE" not in env2
    specs = sorted(p.name for p in dra_node.cdi_dir.glob("gpushare.io-claim-*.json"))
    assert len(specs) == 2, specs


def test_a_restarted_driver_serves_new_claims_and_unprepares_old_ones(dra_node: RealNode) -> None:
    cluster = dra_node.cluster
    dra_node.kill("gpushare-dra-driver")
    start_driver(dra_node)
    create(cluster, [claim("c3", {"memory": "2Gi"}), claimed_pod("p3", "c3")])
    assert running_env(cluster, "p3")["ALIYUN_COM_GPU_MEM_CONTAINER"] == "2"
    for name in ("p1", "p2"):  # the pods the driver prepared before its restart run on
        assert cluster.kubectl_json("get", "pod", name, "-n", NS)["status"]["phase"] == "Running"
    # the pods prepared by the driver before its restart are unprepared by the new one
    cluster.kubectl("delete", "pods", "--all", "-n", NS, "--grace-period=1", timeout=120)
    eventually(
        lambda: not list(dra_node.cdi_dir.glob("gpushare.io-claim-*.json")),
        timeout=60,
        what="every claim's CDI spec removed",
    )
    assert "phase=unprepare" in driver_log(dra_node)
    state = json.loads(
        Path(dra_node.state_dir / f"dra-prepared-{NODE_NAME}.json").read_text() or "{}"
    )
    assert state == {}


def test_an_unhealthy_gpu_leaves_the_slice(dra_node: RealNode) -> None:
    cluster = dra_node.cluster
    health = dra_node.root / "fake-health"
    health.write_text("0\n")
    try:
        eventually(lambda: devices(cluster) == ["gpu-1"], timeout=30, what="gpu-0 withdrawn")
    finally:
        health.write_text("")
    eventually(lambda: devices(cluster) == ["gpu-0", "gpu-1"], timeout=30, what="gpu-0 back")


def test_a_kubelet_restart_registers_the_driver_again_and_the_slice_comes_back(
    dra_node: RealNode,
) -> None:
    """kubelet deletes its node's slices when it starts; the driver publishes again when kubelet
    registers it anew, and serves claims."""
    cluster = dra_node.cluster
    before = registered_times(dra_node)
    dra_node.kill("kubelet", 15)
    dra_node.start_kubelet()
    dra_node.wait_ready()
    eventually(lambda: registered_times(dra_node) > before, timeout=60, what="registered again")
    eventually(lambda: devices(cluster) == ["gpu-0", "gpu-1"], timeout=30, what="the slice")
    try:
        create(cluster, [claim("c5", {"memory": "4Gi"}), claimed_pod("p5", "c5")])
        assert running_env(cluster, "p5")["ALIYUN_COM_GPU_MEM_CONTAINER"] == "4"
    finally:
        cluster.kubectl("delete", "pods", "--all", "-n", NS, "--grace-period=1", timeout=120)


def test_a_core_mem_node_enforces_the_consumed_capacity_with_the_interposer(
    dra_node: RealNode,
) -> None:
    """The isolation hook adds the interposer, its limits from the consumed capacity and the
    mount check to the claim's CDI spec, as it does to an Allocate answer."""
    cluster = dra_node.cluster
    cluster.kubectl("label", "node", NODE_NAME, "ack.node.gpu.schedule=core_mem", "--overwrite")
    dra_node.kill("gpushare-dra-driver")
    try:
        start_driver(dra_node)
        create(cluster, [claim("c6", {"memory": "2Gi", "cores": "30"}), claimed_pod("p6", "c6")])
        env = running_env(cluster, "p6")
        assert env["ALIYUN_COM_GPU_MEM_CONTAINER"] == "2"
        assert env["ALIYUN_COM_GPU_CORE_PERCENTAGE"] == "30"
        assert env["GPUSHARE_MODE"] == "core_mem"
        assert env["GPUSHARE_MEM_LIMIT"] == str(2 * 1024**3)
        assert env["GPUSHARE_CORE_LIMIT"] == "30"
        assert "libgpushare-cuda.so" in env["PROBE_MAPPED"], env
        [spec] = dra_node.cdi_dir.glob("gpushare.io-claim-*.json")
        mounts = json.loads(spec.read_text())["devices"][0]["containerEdits"]["mounts"]
        assert all("ro" in m["options"] for m in mounts), mounts
    finally:
        cluster.kubectl("delete", "pods", "--all", "-n", NS, "--grace-period=1", timeout=120)
        cluster.kubectl("label", "node", NODE_NAME, "ack.node.gpu.schedule=share", "--overwrite")
        dra_node.kill("gpushare-dra-driver")
        start_driver(dra_node)


def test_a_128mib_node_publishes_its_unit_and_rounds_claims_up(dra_node: RealNode) -> None:
    cluster = dra_node.cluster
    dra_node.kill("gpushare-dra-driver")
    dra_node.unit = "128MiB"
    try:
        start_driver(dra_node)

        def stepped() -> bool:
            found = slices(cluster)
            return (
                bool(found)
                and found[0]["spec"]["devices"][0]["capacity"]["memory"]["requestPolicy"][
                    "validRange"
                ]["step"]
                == "128Mi"
            )

        eventually(stepped, timeout=30, what="the slice in 128MiB steps")
        create(cluster, [claim("c4", {"memory": "300Mi"}), claimed_pod("p4", "c4")])
        env = running_env(cluster, "p4")
        assert allocation(cluster, "c4")["consumedCapacity"]["memory"] == "384Mi"
        assert env["ALIYUN_COM_GPU_MEM_CONTAINER"] == "3"
        assert env["GPUSHARE_MEM_UNIT"] == "128MiB"
        assert env["ALIYUN_COM_GPU_MEM_DEV"] == str(15 * 8)
    finally:
        cluster.kubectl("delete", "pods", "--all", "-n", NS, "--grace-period=1", timeout=120)
        dra_node.unit = "1GiB"
