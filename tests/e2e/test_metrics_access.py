"""Who may read the extender's and the device plugin's /metrics, asked of the real API server
with the chart's RBAC.

The chart's RBAC (``helm template``: the scheduler's ServiceAccount and roles, and
``metrics-rbac.yaml``) is applied, and an extender runs as the chart's scheduler ServiceAccount
with its metrics port guarded, as in the chart. Then, with tokens from ``kubectl create
token``: no token is 401, a tenant ServiceAccount (rights in its own namespace only) 403, the
monitoring stack's ServiceAccount (bound through ``metrics.authorization.subjects``) and the
PodMonitors' scraper 200; ``/healthz`` needs none. Repeated scrapes cost the API server one
TokenReview and one SubjectAccessReview per cache TTL, and a token whose ServiceAccount is
deleted stops reading within it (and kube-apiserver's own 10 s token cache). The device
plugin's metrics server, wired as its command wires it, asks as the chart's device-plugin
ServiceAccount (no kubelet needed for that).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.cli.scrapeaccess import metrics_access
from gpushare.deviceplugin.config import PluginConfig
from gpushare.deviceplugin.metrics import registry_for, serve_metrics
from gpushare.deviceplugin.plugin import DevicePlugin
from gpushare.kube.lightkube_api import LightkubeAPI
from gpushare.kube.memory import MemoryKube
from gpushare.node.gpus import FakeGpus
from harness.cluster import Cluster, free_port, wait_for
from harness.helpers import scrape_with_token
from harness.identities import token_kubeconfig
from tests.support.e2e import eventually
from tests.support.scraping import samples

RELEASE = "gpushare-ma"
NAMESPACE = "gpushare-metrics-auth"
TENANT = "tenant-metrics"
MONITORING = "monitoring-e2e"
TTL_S = 5
APISERVER_TOKEN_CACHE_S = 10
"""kube-apiserver remembers a token it authenticated for 10 s itself (its token authenticator's
success cache), so a deleted ServiceAccount's token passes a TokenReview that long."""
RBAC = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


def chart_rbac(cluster: Cluster) -> list[dict[str, Any]]:
    """The chart's scheduler and metrics RBAC as ``helm template`` renders it."""
    subjects = [{"kind": "ServiceAccount", "name": "prometheus", "namespace": MONITORING}]
    rendered = subprocess.run(
        [
            str(cluster.binaries["helm"]),
            "template",
            RELEASE,
            str(Path(__file__).parents[2] / "charts" / "gpushare"),
            "--namespace",
            NAMESPACE,
            "--kube-version",
            "1.36.0",
            "--set",
            "podMonitor.enabled=true",
            "--set-json",
            f"metrics.authorization.subjects={json.dumps(subjects)}",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        env={
            "PATH": "/usr/bin:/bin",
            **{
                f"HELM_{d}_HOME": str(cluster.root / "helm-ma" / d)
                for d in ("CACHE", "CONFIG", "DATA")
            },
        },
    ).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    wanted = (f"{RELEASE}-scheduler", f"{RELEASE}-device-plugin", f"{RELEASE}-metrics-")
    return [
        d
        for d in docs
        if (d["kind"] in RBAC and d["metadata"]["name"].startswith(wanted))
        or (d["kind"] == "Secret" and d["metadata"]["name"].endswith("-metrics-scraper-token"))
    ]


def token(cluster: Cluster, namespace: str, name: str) -> str:
    return cluster.kubectl("-n", namespace, "create", "token", name).stdout.strip()


def reviews(text: str) -> dict[str, float]:
    got = samples(text)
    return {
        kind: got[("gpushare_metrics_reviews_total", (("review", kind),))]
        for kind in ("token", "access")
    }


@pytest.fixture(scope="module")
def chart_identities(cluster: Cluster) -> Iterator[None]:
    """The chart's RBAC applied; a tenant ServiceAccount holding admin in its namespace, and the
    monitoring stack's ServiceAccount (bound through metrics.authorization.subjects)."""
    for namespace in (NAMESPACE, TENANT, MONITORING):
        cluster.create_namespace(namespace, check=False)
    docs = chart_rbac(cluster)
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    cluster.kubectl("-n", TENANT, "create", "serviceaccount", "workload")
    cluster.kubectl(
        "-n",
        TENANT,
        "create",
        "rolebinding",
        "workload-admin",
        "--clusterrole=admin",
        f"--serviceaccount={TENANT}:workload",
    )
    cluster.kubectl("-n", MONITORING, "create", "serviceaccount", "prometheus")
    try:
        yield
    finally:
        cluster.kubectl("delete", "namespace", TENANT, MONITORING, "--wait=false", check=False)
        cluster.kubectl(
            "delete", "-f", "-", "--wait=false", check=False, input=yaml.safe_dump_all(docs)
        )


def test_the_device_plugins_metrics_answer_its_chart_identitys_reviews(
    cluster: Cluster, chart_identities: None, tmp_path: Path
) -> None:
    """The device plugin's metrics server as ``gpushare device-plugin`` wires it
    (``metrics_access``), asking the API server as the chart's device-plugin ServiceAccount."""
    identity = token_kubeconfig(
        cluster,
        token(cluster, NAMESPACE, f"{RELEASE}-device-plugin"),
        tmp_path / "plugin.kubeconfig",
    )
    plugin = DevicePlugin(
        api=MemoryKube(),
        source=FakeGpus.parse("T4:15GiB", node="n1"),
        config=PluginConfig(node="n1", state_dir=tmp_path),
    )
    guard, cert = metrics_access(
        LightkubeAPI.connect(str(identity)),
        enabled=True,
        cert_file=None,
        key_file=None,
        ttl_s=60,
        name="gpushare-device-plugin.n1",
    )
    port = free_port()
    serve_metrics(registry_for(plugin, "n1"), port=port, host="127.0.0.1", guard=guard, cert=cert)
    url = f"https://127.0.0.1:{port}"
    got = {
        "no token": scrape_with_token(f"{url}/metrics")[0],
        "tenant token": scrape_with_token(f"{url}/metrics", token(cluster, TENANT, "workload"))[0],
        "/healthz, no token": scrape_with_token(f"{url}/healthz")[0],
        "monitoring token": scrape_with_token(
            f"{url}/metrics", token(cluster, MONITORING, "prometheus")
        )[0],
    }
    print(f"device plugin metrics access (status codes): {got}")
    assert got == {
        "no token": 401,
        "tenant token": 403,
        "/healthz, no token": 200,
        "monitoring token": 200,
    }


@pytest.mark.usefixtures("chart_identities")
def test_only_the_monitoring_identity_reads_the_extenders_metrics(
    cluster: Cluster, tmp_path: Path
) -> None:
    identity = token_kubeconfig(
        cluster,
        token(cluster, NAMESPACE, f"{RELEASE}-scheduler"),
        tmp_path / "ext.kubeconfig",
        user="extender",
    )
    port, metrics_port = free_port(), free_port()
    extender = cluster._spawn(
        "gpushare-extender-metrics-auth",
        [
            str(Path(sys.executable).parent / "gpushare"),
            "extender",
            "--kubeconfig",
            str(identity),
            "--port",
            str(port),
            "--metrics-port",
            str(metrics_port),
            "--metrics-auth-cache-ttl",
            str(TTL_S),
            "--seal-key-file",
            str(cluster.seal_key),
            "--log-level",
            "info",
        ],
    )
    url = f"https://127.0.0.1:{metrics_port}"
    try:
        wait_for(
            "the extender's /readyz as the chart's scheduler ServiceAccount",
            lambda: (
                urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5).status == 200
            ),
            90,
            extender,
        )
        tenant = token(cluster, TENANT, "workload")
        prometheus = token(cluster, MONITORING, "prometheus")
        scraper = token(cluster, NAMESPACE, f"{RELEASE}-metrics-scraper")

        figures: dict[str, int] = {}
        figures["no token"], body = scrape_with_token(f"{url}/metrics")
        assert figures["no token"] == 401 and "gpushare_" not in body
        figures["tenant token"], body = scrape_with_token(f"{url}/metrics", tenant)
        assert figures["tenant token"] == 403, body
        assert f"system:serviceaccount:{TENANT}:workload" in json.loads(body)["reason"]
        assert "gpushare_" not in body
        figures["forged token"], _ = scrape_with_token(f"{url}/metrics", "not-a-token")
        assert figures["forged token"] == 401
        figures["/healthz, no token"], body = scrape_with_token(f"{url}/healthz")
        assert (figures["/healthz, no token"], body) == (200, "ok")
        figures["monitoring token"], body = scrape_with_token(f"{url}/metrics", prometheus)
        assert figures["monitoring token"] == 200 and "gpushare_build_info" in body
        figures["PodMonitor scraper token"], _ = scrape_with_token(f"{url}/metrics", scraper)
        assert figures["PodMonitor scraper token"] == 200

        # cost: a pair of reviews per token per TTL, whatever the number of scrapes
        started = time.monotonic()
        before = reviews(scrape_with_token(f"{url}/metrics", prometheus)[1])
        for _ in range(10):
            assert scrape_with_token(f"{url}/metrics", prometheus)[0] == 200
        after = reviews(scrape_with_token(f"{url}/metrics", prometheus)[1])
        expiries = int((time.monotonic() - started) // TTL_S) + 1
        assert after["token"] - before["token"] <= expiries, (before, after)
        assert after["access"] - before["access"] <= expiries, (before, after)

        # revoked: the monitoring ServiceAccount deleted, its token stops within the TTL
        cluster.kubectl("-n", MONITORING, "delete", "serviceaccount", "prometheus")
        revoked = time.monotonic()
        eventually(
            lambda: scrape_with_token(f"{url}/metrics", prometheus)[0] == 401,
            TTL_S + APISERVER_TOKEN_CACHE_S + 15,
            "the deleted ServiceAccount's token refused",
        )
        refused_after = time.monotonic() - revoked
        print(f"metrics access figures (status codes): {figures}")
        print(f"reviews after the first scrapes: {before}; after 10 more scrapes: {after}")
        print(
            f"a deleted ServiceAccount's token refused after {refused_after:.1f} s (TTL {TTL_S} s)"
        )
        assert refused_after <= TTL_S + APISERVER_TOKEN_CACHE_S + 5
    finally:
        extender.stop()
