"""``helm install`` of charts/gpushare with ``dra.enabled=true`` on the real node, its pods run as
pods: each component with the identity, RBAC and values the chart gives it.

The real node (kubelet v1.36.3, containerd 2 with CDI, fake GPUs ``4x15GiB``) is labelled
``gpushare.io/allocation-mode=dra`` before the install. What this shows, in order:

- the chart's DRA driver DaemonSet places its pod there, kubelet registers it, its readiness
  probe passes and the API server accepts the node's ResourceSlice (one device per GPU);
- the device plugin's DaemonSet keeps off the node (one mode per node);
- the scheduler Deployment's extender runs with ``--dra-allocator``;
- ``helm test``'s GPU pod (``tests.gpuPod.mode=dra``): a claim of one unit, allocated by the
  chart's extender, prepared by the driver, its hand-off checked from inside the container;
- the seed ``examples/GPUtest.yaml`` (its command replaced by the probe) in a namespace labelled
  for DRA mode: the chart's webhook turns the pod's ``aliyun.com/gpu-mem: 3`` into a claim and
  gates it, the chart's extender allocates the claim (``consumedCapacity`` memory 3Gi on
  ``gpu-0``, reserved for the pod), the chart's kube-scheduler binds it, and the driver's CDI spec
  gives the container ACK's variables;
- ``helm uninstall`` leaves no slice of the node behind.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.core.model.names import (
    ALLOCATION_MODE_DRA,
    DRA_DEVICE_CLASS,
    DRA_DRIVER,
    DRA_SCHEDULING_GATE,
    LABEL_ALLOCATION_MODE,
)
from harness.cluster import Cluster
from harness.ports import free_port
from harness.realnode import TOLERATION, RealNode, hand_off, probe_env
from tests.support.e2e import CHART, eventually, helm
from tests.support.realchart import (
    REAL_NAMESPACE,
    REAL_RELEASE,
    WEBHOOK_LABEL,
    api_relay,
    chart_node,
    component_pods,
    helm_test_gpu_pod,
    open_bridge,
    pod_ready,
    real_values,
    wait_components,
    why_not,
)
from tests.support.realnode import NS as REAL_NS
from tests.support.realnode import PROBE_THEN, local_job, ns_pods

DRA_COMPONENTS = ("scheduler", "webhook", "dra-driver")


@pytest.fixture(scope="module")
def dra_helm_node(cluster: Cluster) -> Iterator[tuple[RealNode, dict[str, str]]]:
    """The real node for the chart (``realchart.chart_node``), labelled for DRA mode."""
    for node, images in chart_node(cluster):
        cluster.kubectl(
            "label", "node", node.name, f"{LABEL_ALLOCATION_MODE}={ALLOCATION_MODE_DRA}"
        )
        try:
            yield node, images
        finally:
            cluster.kubectl(
                "delete",
                "resourceslices",
                f"--field-selector=spec.nodeName={node.name}",
                "--ignore-not-found",
                check=False,
            )
            cluster.kubectl("label", "node", node.name, f"{LABEL_ALLOCATION_MODE}-", check=False)


def dra_values(
    cluster: Cluster, node: RealNode, images: dict[str, str], api_server: str
) -> dict[str, Any]:
    """``realchart.real_values`` with DRA mode on: the API server at ``api_server`` (the relay
    on the pods' bridge: DRA mode's webhook calls it from the pod network), the driver given
    this node's kubelet directories, its CDI directory (the only one containerd reads here)
    and state paths, and a health port on the host network nobody else on this machine holds."""
    values = real_values(cluster, node, images)
    values["testing"]["apiServer"] = api_server
    values["dra"] = {
        "enabled": True,
        "driver": {
            "kubeletPluginsPath": str(node.kubelet_root / "plugins"),
            "kubeletRegistryPath": str(node.kubelet_root / "plugins_registry"),
            "cdiDir": str(node.cdi_dir),
            "cdiSpecDirs": [str(node.cdi_dir)],
            "stateHostPath": str(node.state_dir),
            "deviceListStrategy": node.device_list_strategy,
            "healthPort": free_port(),
            "tolerations": [TOLERATION],
        },
    }
    # the release namespace is not labelled for DRA: helm test's GPU pod asks its unit by claim
    values.setdefault("tests", {}).setdefault("gpuPod", {})["mode"] = "dra"
    return values


def node_slices(cluster: Cluster, node: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.kubectl_json(
        "get", "resourceslices", f"--field-selector=spec.nodeName={node}"
    )["items"]
    return items


def claim_of(cluster: Cluster, pod: dict[str, Any]) -> dict[str, Any]:
    """The pod's claim as it is now; {} before the resourceclaim controller made it."""
    namespace = pod["metadata"]["namespace"]
    got = cluster.kubectl_json("get", "pod", "-n", namespace, pod["metadata"]["name"])
    for entry in (got.get("status") or {}).get("resourceClaimStatuses") or []:
        if entry.get("resourceClaimName"):
            found: dict[str, Any] = cluster.kubectl_json(
                "get", "resourceclaim", "-n", namespace, entry["resourceClaimName"],
                "--show-managed-fields",
            )  # fmt: skip
            return found
    return {}


def failure_context(cluster: Cluster) -> str:
    driver = cluster.kubectl(
        "logs", "-n", REAL_NAMESPACE, "-l", "app.kubernetes.io/component=dra-driver",
        "--tail=30", check=False,
    )  # fmt: skip
    webhook = cluster.kubectl(
        "logs", "-n", REAL_NAMESPACE, "-l", "app.kubernetes.io/component=webhook",
        "--tail=20", check=False,
    )  # fmt: skip
    return (
        f"{why_not(cluster)}\n--- dra-driver log\n{driver.stdout[-3000:]}{driver.stderr[-500:]}"
        f"\n--- webhook log\n{webhook.stdout[-2000:]}{webhook.stderr[-500:]}"
    )


@pytest.mark.e2e
def test_helm_install_in_dra_mode_runs_on_the_real_node(
    cluster: Cluster, dra_helm_node: tuple[RealNode, dict[str, str]], tmp_path: Path
) -> None:
    node, images = dra_helm_node
    cluster.create_namespace(REAL_NAMESPACE)
    cluster.kubectl(
        "delete", "namespace", REAL_NS, "--ignore-not-found", "--wait=true", timeout=180
    )
    cluster.create_namespace(REAL_NS)
    open_bridge(cluster, REAL_NS)
    with api_relay(cluster) as api_server:
        values = tmp_path / "values.yaml"
        values.write_text(yaml.safe_dump(dra_values(cluster, node, images, api_server)))
        installed_and_checked(cluster, node, values)
    # The slice goes with the driver: kubelet deletes a driver's slices once it left
    # (pkg/kubelet/cm/dra/plugin, kubernetes v1.36.3), or the driver at its stop.
    gone = time.monotonic()
    eventually(lambda: not node_slices(cluster, node.name), 90, "the node's slices deleted")
    print(f"[e2e] no slice left {time.monotonic() - gone:.1f}s after uninstall", flush=True)
    assert not cluster.kubectl(
        "get", "deviceclass", DRA_DEVICE_CLASS, "--ignore-not-found", "-o", "name"
    ).stdout.strip()
    cluster.kubectl("delete", "namespace", REAL_NAMESPACE, "--wait=false", check=False)


def installed_and_checked(cluster: Cluster, node: RealNode, values: Path) -> None:
    """Install with ``values``, check each component and GPUtest, uninstall (whatever
    happened)."""
    # checked by the chart's webhook (its scope here), and in DRA mode: a seed lands unchanged
    cluster.kubectl(
        "label",
        "namespace",
        REAL_NS,
        f"{WEBHOOK_LABEL}={REAL_NS}",
        f"{LABEL_ALLOCATION_MODE}={ALLOCATION_MODE_DRA}",
    )
    installed = False
    try:
        started = time.monotonic()
        helm(
            cluster, "install", REAL_RELEASE, str(CHART), "-n", REAL_NAMESPACE,
            "-f", str(values), "--wait=false",
        )  # fmt: skip
        installed = True
        wait_components(
            cluster, "scheduler, webhook and DRA driver Ready", components=DRA_COMPONENTS
        )
        print(f"[e2e] chart in DRA mode running in {time.monotonic() - started:.1f}s", flush=True)

        # the driver's pod is on the node and Ready (/readyz: registered, slice published)
        [driver] = component_pods(cluster)["dra-driver"]
        assert driver["spec"]["nodeName"] == node.name and pod_ready(driver)
        [published] = node_slices(cluster, node.name)
        assert published["spec"]["driver"] == DRA_DRIVER
        assert published["spec"]["pool"]["name"] == node.name
        names = sorted(d["name"] for d in published["spec"]["devices"])
        assert names == [f"gpu-{i}" for i in range(4)], names
        # the device plugin keeps off a DRA node
        plugins = [
            p
            for p in component_pods(cluster).get("device-plugin", [])
            if p["spec"].get("nodeName") == node.name
        ]
        assert plugins == [], [p["metadata"]["name"] for p in plugins]
        # the scheduler's extender allocates claims
        deployment = cluster.kubectl_json(
            "get", "deployment", "-n", REAL_NAMESPACE, f"{REAL_RELEASE}-scheduler"
        )
        [extender] = [
            c
            for c in deployment["spec"]["template"]["spec"]["containers"]
            if c["name"] == "extender"
        ]
        assert "--dra-allocator" in extender["args"], extender["args"]
        assert cluster.kubectl_json("get", "deviceclass", DRA_DEVICE_CLASS)

        # helm test's GPU pod in DRA mode: its claim allocated by the chart's allocator (the pod
        # is gated), prepared by the driver, and the hand-off checked from inside
        passed = helm_test_gpu_pod(cluster)
        print(f"[e2e] helm test's GPU pod:\n{passed.stdout.partition('POD LOGS')[2]}", flush=True)
        assert "Phase:          Succeeded" in passed.stdout, passed.stdout + passed.stderr
        assert "ok   device nodes /dev/nvidia" in passed.stdout and "hand-off ok" in passed.stdout

        # GPUtest: converted by the chart's webhook, allocated by its extender, bound by its
        # kube-scheduler, prepared by its driver
        asked = time.monotonic()
        job = local_job("GPUtest.yaml", command=["/bin/sh", "-c", PROBE_THEN + "sleep 3600"])
        cluster.kubectl("apply", "-f", "-", input=json.dumps(job))
        [pod] = eventually(lambda: ns_pods(cluster, REAL_NS), 30, "the GPUtest pod")
        spec = pod["spec"]
        assert spec["resourceClaims"][0]["resourceClaimTemplateName"].startswith("gpushare-")
        [container] = spec["containers"]
        limits = container["resources"].get("limits") or {}
        assert not [k for k in limits if k.startswith("aliyun.com/")], limits
        assert container["resources"]["claims"] == [
            {"name": spec["resourceClaims"][0]["name"], "request": "gpu-share-sample"}
        ]
        gates = [g["name"] for g in spec.get("schedulingGates") or []]
        assert gates in ([DRA_SCHEDULING_GATE], []), gates

        def running() -> dict[str, Any] | None:
            items = ns_pods(cluster, REAL_NS)
            return next((p for p in items if p["status"].get("phase") == "Running"), None)

        item = eventually(running, 120, "GPUtest pod Running")
        print(f"[e2e] GPUtest Running {time.monotonic() - asked:.1f}s after apply", flush=True)
        assert item["spec"]["nodeName"] == node.name
        assert not item["spec"].get("schedulingGates")
        claim = claim_of(cluster, item)
        status = claim.get("status") or {}
        [result] = status["allocation"]["devices"]["results"]
        assert (result["driver"], result["pool"], result["device"]) == (
            DRA_DRIVER,
            node.name,
            "gpu-0",
        ), result
        assert result["consumedCapacity"]["memory"] == "3Gi", result
        assert result.get("shareID"), result
        reserved = [(r["resource"], r["name"], r["uid"]) for r in status["reservedFor"]]
        assert reserved == [("pods", item["metadata"]["name"], item["metadata"]["uid"])]
        # gpushare's allocator wrote the status, not kube-scheduler's own allocator
        writers = {
            f["manager"]
            for f in claim["metadata"].get("managedFields") or []
            if f.get("subresource") == "status"
        }
        print(f"[e2e] the claim's status written by {sorted(writers)}", flush=True)
        assert writers and "kube-scheduler" not in writers, writers
        extender_log = cluster.kubectl(
            "logs", "-n", REAL_NAMESPACE, "-l", "app.kubernetes.io/component=scheduler",
            "-c", "extender", "--tail=-1",
        ).stdout  # fmt: skip
        assert "left to kube-scheduler" not in extender_log, extender_log[-2000:]

        name = item["metadata"]["name"]
        env = eventually(
            lambda: probe_env(cluster.kubectl("logs", "-n", REAL_NS, name).stdout), 30, "logs"
        )
        print(f"[e2e] GPUtest's environment: {env}", flush=True)
        assert env["ALIYUN_COM_GPU_MEM_CONTAINER"] == "3"
        assert env["ALIYUN_COM_GPU_MEM_DEV"] == "15"
        assert env["ALIYUN_COM_GPU_MEM_IDX"] == "0"
        uuids = {g.index: g.uuid for g in node.fake_gpus_list()}
        wanted = hand_off([0], uuids, node.device_list_strategy)
        assert {k: env.get(k) for k in wanted} == wanted

        cluster.kubectl("delete", "job", "-n", REAL_NS, "gpu-share-sample", "--wait=true")
        eventually(lambda: not ns_pods(cluster, REAL_NS), 90, "GPUtest pod gone")
    except BaseException:
        print(failure_context(cluster), flush=True)
        raise
    finally:
        if installed:
            uninstalling = time.monotonic()
            helm(cluster, "uninstall", REAL_RELEASE, "-n", REAL_NAMESPACE, "--wait", check=False)
            print(f"[e2e] uninstalled in {time.monotonic() - uninstalling:.1f}s", flush=True)
        cluster.kubectl("delete", "namespace", REAL_NS, "--wait=false", check=False)
