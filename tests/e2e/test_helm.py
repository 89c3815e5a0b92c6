"""``helm install`` of charts/gpushare into the real control plane.

What this shows: the API server accepts every object the chart renders (RBAC, the scheduler's
ConfigMap and Deployment, the device-plugin DaemonSet with system-node-critical priority and its
hostPaths, the webhook's Service, Deployment and both webhook configurations, the cert Job);
the DaemonSet controller places a device-plugin pod on a node labelled
``ack.node.gpu.schedule``; the chart's KubeSchedulerConfiguration is the one kube-scheduler runs
with here (the URL apart) and its ValidatingWebhookConfiguration the one test_webhook.py
registers (where to call apart); and an upgrade (a server-side dry run) that changes
``gpuMemoryUnit`` while a pod holds GPU memory is refused with the chart's message.

What it cannot show: nothing the chart starts runs. The nodes are kwok's, without kubelets and
without the image: pods the chart creates are either unscheduled or bound to a kwok node and
marked Running by kwok without executing anything, so the cert Job never writes its Secret and
the webhook never answers. The webhook configuration is therefore installed with
``failurePolicy: Ignore`` and scoped to namespaces carrying a label nobody has (the chart's
ValidatingAdmissionPolicy binding takes the same scope), so neither can get in the way of the
other tests, and the release is uninstalled at the end.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.core.names import ANN_NODE_UNIT
from gpushare.webhook.configuration import steering_configuration, webhook_configuration

from .cluster import Cluster
from .conftest import create_nodes, delete_nodes, eventually, kwok_node

CHART = Path(__file__).resolve().parents[2] / "charts" / "gpushare"
RELEASE = "gpushare-e2e"


def helm(cluster: Cluster, *args: str, check: bool = True) -> Any:
    import subprocess

    result = subprocess.run(
        [str(cluster.binaries["helm"]), *args],
        env={
            **cluster.env(),
            "HELM_CACHE_HOME": str(cluster.root / "helm" / "cache"),
            "HELM_CONFIG_HOME": str(cluster.root / "helm" / "config"),
            "HELM_DATA_HOME": str(cluster.root / "helm" / "data"),
        },
        capture_output=True,
        text=True,
        timeout=180,
    )
    if check:
        assert result.returncode == 0, f"helm {' '.join(args)}:\n{result.stdout}{result.stderr}"
    return result


def without_client(webhook: dict[str, Any]) -> dict[str, Any]:
    """A webhook of a configuration, without clientConfig (URL here, Service in the chart)."""
    return {k: v for k, v in webhook.items() if k != "clientConfig"}


def stored_webhook(cluster: Cluster, configuration: dict[str, Any]) -> dict[str, Any]:
    """The configuration's webhook as the API server would store it (a server dry run)."""
    created = cluster.kubectl(
        "create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(configuration)
    )
    webhook: dict[str, Any] = json.loads(created.stdout)["webhooks"][0]
    return webhook


def semantic(config: dict[str, Any]) -> dict[str, Any]:
    """What must agree: profiles and extenders, without the URL (ports differ)."""
    extenders = [{k: v for k, v in e.items() if k != "urlPrefix"} for e in config["extenders"]]
    return {
        "apiVersion": config["apiVersion"],
        "kind": config["kind"],
        "profiles": config["profiles"],
        "extenders": extenders,
    }


@pytest.mark.e2e
def test_helm_install(cluster: Cluster) -> None:
    suffix = uuid.uuid4().hex[:6]
    namespace = f"gpushare-helm-{suffix}"
    node = f"helm-gpu-{suffix}"
    holder = "holds-gpu-mem"
    cluster.kubectl("create", "namespace", namespace)
    create_nodes(cluster, [kwok_node(node)])
    values = [
        "--set",
        "scheduler.defaultProfile=true",
        "--set",
        "webhook.failurePolicy=Ignore",
        "--set",
        "webhook.steer.failurePolicy=Ignore",
        "--set",
        f"webhook.namespaceLabels.gpushare\\.io/e2e-webhook={namespace}",
    ]
    try:
        helm(cluster, "install", RELEASE, str(CHART), "-n", namespace, "--wait=false", *values)
        assert "STATUS: deployed" in helm(cluster, "status", RELEASE, "-n", namespace).stdout

        # Every object the release holds exists in the API server.
        manifest = helm(cluster, "get", "manifest", RELEASE, "-n", namespace).stdout
        rendered = [d for d in yaml.safe_load_all(manifest) if d]
        got = json.loads(cluster.kubectl("get", "-f", "-", "-o", "json", input=manifest).stdout)[
            "items"
        ]
        assert sorted((d["kind"], d["metadata"]["name"]) for d in rendered) == sorted(
            (d["kind"], d["metadata"]["name"]) for d in got
        )
        kinds = {d["kind"] for d in got}
        assert {
            "Deployment",
            "DaemonSet",
            "Job",
            "ValidatingWebhookConfiguration",
            "MutatingWebhookConfiguration",
        } <= kinds

        webhook = cluster.kubectl_json(
            "get", "validatingwebhookconfiguration", f"{RELEASE}-webhook"
        )["webhooks"][0]
        assert webhook["failurePolicy"] == "Ignore"
        assert webhook["namespaceSelector"]["matchLabels"] == {"gpushare.io/e2e-webhook": namespace}
        # ... and it is what `gpushare webhook-config` gives test_webhook.py, both as the API
        # server stores them (defaults filled in), apart from where to call (URL vs Service).
        rendered_config = webhook_configuration(
            ca_bundle="",
            url="https://127.0.0.1:1/validate",
            failure_policy="Ignore",
            excluded_namespaces=["kube-system", namespace],
            namespace_labels={"gpushare.io/e2e-webhook": namespace},
            trusted_users=[
                f"system:serviceaccount:{namespace}:{RELEASE}-scheduler",
                f"system:serviceaccount:{namespace}:{RELEASE}-device-plugin",
            ],
            name=f"{RELEASE}-renderer",
        )
        assert without_client(webhook) == without_client(stored_webhook(cluster, rendered_config))
        # the steering configuration, the same way
        steering = cluster.kubectl_json(
            "get", "mutatingwebhookconfiguration", f"{RELEASE}-webhook"
        )["webhooks"][0]
        rendered_steering = steering_configuration(
            ca_bundle="",
            url="https://127.0.0.1:1/mutate",
            failure_policy="Ignore",
            excluded_namespaces=["kube-system", namespace],
            namespace_labels={"gpushare.io/e2e-webhook": namespace},
            name=f"{RELEASE}-renderer",
        )
        stored_steering = stored_webhook(cluster, rendered_steering)
        assert without_client(steering) == without_client(stored_steering)

        # The DaemonSet controller puts a device-plugin pod on the labelled node.
        def daemon_pods() -> list[str]:
            pods = cluster.kubectl_json(
                "get", "pods", "-n", namespace, "-l", "app.kubernetes.io/component=device-plugin"
            )["items"]
            return [p["spec"].get("nodeName") or "" for p in pods]

        assert node in eventually(lambda: node in daemon_pods() and daemon_pods(), 60, "DS pod")

        # The scheduler configuration is the one this control plane's kube-scheduler runs.
        configmap = cluster.kubectl_json(
            "get", "configmap", f"{RELEASE}-scheduler", "-n", namespace
        )
        chart_config = yaml.safe_load(configmap["data"]["scheduler-config.yaml"])
        harness_config = yaml.safe_load((cluster.root / "scheduler-config.yaml").read_text())
        assert semantic(chart_config) == semantic(harness_config)
        assert chart_config["leaderElection"] == {
            "leaderElect": True,
            "resourceLock": "leases",
            "resourceNamespace": namespace,
            "resourceName": f"{RELEASE}-scheduler",
        }

        # Changing the unit while a pod holds GPU memory on a 1GiB node is refused.
        assert (
            cluster.kubectl_json("get", "node", node)["metadata"]["annotations"][ANN_NODE_UNIT]
            == "1GiB"
        )
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": holder, "namespace": namespace},
            "spec": {
                "nodeName": node,
                "containers": [
                    {
                        "name": "main",
                        "image": "busybox:1.37",
                        "resources": {"limits": {"aliyun.com/gpu-mem": "3"}},
                    }
                ],
            },
        }
        cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))
        upgrade = [
            "upgrade",
            RELEASE,
            str(CHART),
            "-n",
            namespace,
            "--reuse-values",
            "--dry-run=server",
        ]
        refused = helm(cluster, *upgrade, "--set", "gpuMemoryUnit=128MiB", check=False)
        assert refused.returncode != 0
        assert "gpuMemoryUnit=128MiB refused: nodes publish gpuMemoryUnit=1GiB" in refused.stderr
        assert f"{namespace}/{holder} on {node}" in refused.stderr
        assert "--set gpuMemoryUnit=1GiB" in refused.stderr
        # The same unit passes, and so does the change once nothing holds memory.
        helm(cluster, *upgrade)
        cluster.kubectl(
            "delete", "pod", holder, "-n", namespace, "--grace-period=0", "--force", check=False
        )
        eventually(
            lambda: (
                holder not in cluster.kubectl("get", "pods", "-n", namespace, "-o", "name").stdout
            ),
            60,
            "holder pod gone",
        )
        helm(cluster, *upgrade, "--set", "gpuMemoryUnit=128MiB")
    finally:
        helm(cluster, "uninstall", RELEASE, "-n", namespace, "--wait=false", check=False)
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        delete_nodes(cluster, [node])
    assert (
        cluster.kubectl(
            "get", "validatingwebhookconfiguration", f"{RELEASE}-webhook", check=False
        ).returncode
        != 0
    )
