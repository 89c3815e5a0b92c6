"""Pod Security of the release namespace, against the real API server (values: podSecurity).

The device plugin's pods (host paths, hostPID, root) pass only Pod Security's ``privileged``
level (../shared/docs/PLATFORMS.md C2, R5). Before the chart checked it, ``helm install`` into a
namespace enforcing ``baseline`` reported ``deployed`` and the DaemonSet created no pod; the
only trace was its FailedCreate event. Now ``helm install`` (and ``--dry-run=server``) reads the
namespace with ``lookup`` and refuses, naming the label and the command; labelling the
namespace ``privileged`` lets it through.

kwok's nodes run nothing, but the DaemonSet controller and Pod Security admission are real.
"""

from __future__ import annotations

import json
import uuid

from harness.cluster import Cluster
from harness.seeding import kwok_node
from tests.support.e2e import CHART, create_nodes, delete_nodes, eventually, helm

RELEASE = "gpushare-psa"

QUIET = [
    "--set", "webhook.failurePolicy=Ignore",
    "--set", "webhook.steer.failurePolicy=Ignore",
    "--set", "webhook.policy.enabled=false",
    "--set", "scheduler.replicas=1",
]  # fmt: skip
"""Keep the release out of the other tests' way: its webhook answers nothing here."""


def _failed_create(cluster: Cluster, namespace: str) -> str:
    events = cluster.kubectl_json("get", "events", "-n", namespace)["items"]
    found = [e["message"] for e in events if e.get("reason") == "FailedCreate"]
    return found[0] if found else ""


def test_install_into_a_baseline_namespace_is_refused_in_words(cluster: Cluster) -> None:
    suffix = uuid.uuid4().hex[:6]
    namespace = f"gpushare-psa-{suffix}"
    node = f"psa-gpu-{suffix}"
    cluster.create_namespace(namespace)
    cluster.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=baseline")
    create_nodes(cluster, [kwok_node(node)])
    label = f"webhook.namespaceLabels.gpushare\\.io/e2e-webhook={namespace}"
    install = ["install", RELEASE, str(CHART), "-n", namespace, "--wait=false", *QUIET]
    install += ["--set", label]
    try:
        # Before: without the check (as the chart was), the release is "deployed" and the
        # DaemonSet's pods are refused by Pod Security, which only its events say.
        helm(cluster, *install, "--set", "podSecurity.check=false")
        eventually(lambda: _failed_create(cluster, namespace), 60, "the DaemonSet's FailedCreate")
        before = _failed_create(cluster, namespace)
        assert 'violates PodSecurity "baseline:latest"' in before, before
        assert "hostPath volumes" in before and "host namespaces" in before
        helm(cluster, "uninstall", RELEASE, "-n", namespace, "--wait")

        # After: install refuses, saying what to run.
        for args in (install, [*install, "--dry-run=server"]):
            refused = helm(cluster, *args, check=False)
            assert refused.returncode != 0
            assert (
                f'namespace {namespace} enforces Pod Security "baseline" '
                "(label pod-security.kubernetes.io/enforce=baseline)" in refused.stderr
            ), refused.stderr
            assert (
                f"kubectl label namespace {namespace} "
                "pod-security.kubernetes.io/enforce=privileged --overwrite" in refused.stderr
            )
        # Without the device plugin nothing needs privileged: the check stays quiet.
        helm(cluster, *install, "--dry-run=server", "--set", "devicePlugin.enabled=false")

        cluster.kubectl(
            "label", "namespace", namespace,
            "pod-security.kubernetes.io/enforce=privileged", "--overwrite",
        )  # fmt: skip
        helm(cluster, *install)
        daemonset = cluster.kubectl_json(
            "get", "daemonset", f"{RELEASE}-device-plugin", "-n", namespace
        )
        assert daemonset["metadata"]["name"] == f"{RELEASE}-device-plugin"
        eventually(
            lambda: (
                cluster.kubectl_json(
                    "get", "daemonset", f"{RELEASE}-device-plugin", "-n", namespace
                )["status"].get("currentNumberScheduled", 0)
                >= 1
            ),
            60,
            "a device plugin pod created under privileged",
        )
        print(json.dumps({"before": before}))
    finally:
        helm(cluster, "uninstall", RELEASE, "-n", namespace, "--wait=false", check=False)
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        delete_nodes(cluster, [node])
