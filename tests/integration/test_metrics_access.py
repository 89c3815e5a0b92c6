"""/metrics for the monitoring stack only: the extender's metrics port and the device plugin's.

A tenant who can reach a pod IP must not read the series naming every tenant's pods: without a
token the answer is 401, with a token whose identity may not ``get /metrics`` 403, with the
monitoring stack's 200; kubelet's probes stay open. The reviews are ``MemoryReviews`` (the API
server's TokenReview and SubjectAccessReview); the e2e test asks a real one.
"""

from __future__ import annotations

import asyncio
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import httpx
import pytest

from gpushare.cli.errors import CommandError
from gpushare.cli.scrapeaccess import metrics_access
from gpushare.core.admitting.metricsaccess import Identity, ReviewCache
from gpushare.deviceplugin.config import PluginConfig
from gpushare.deviceplugin.metrics import registry_for, serve_metrics
from gpushare.deviceplugin.plugin import DevicePlugin
from gpushare.extender.app import create_metrics_app
from gpushare.kube.memory import MemoryKube, MemoryReviews
from gpushare.kube.metricsguard import MetricsGuard
from gpushare.node.gpus import FakeGpus
from gpushare.servingcert import self_signed
from harness.ports import free_port
from tests.support.rig import Rig, run_with_rig
from tests.support.scraping import cluster, samples

PROMETHEUS = Identity("system:serviceaccount:monitoring:prometheus")
TENANT = Identity("system:serviceaccount:team-a:default")
TOKENS = {"prom-token": PROMETHEUS, "tenant-token": TENANT}


def reviews() -> MemoryReviews:
    return MemoryReviews(tokens=dict(TOKENS), allowed={PROMETHEUS.user})


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_the_extenders_metrics_port_serves_only_the_monitoring_identity() -> None:
    api = reviews()
    guard = MetricsGuard(api, ReviewCache())

    async def body(rig: Rig) -> None:
        app = create_metrics_app(rig.extender, guard)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="https://m") as client:
            anonymous = await client.get("/metrics")
            assert anonymous.status_code == 401
            assert anonymous.headers["www-authenticate"].startswith("Bearer")
            assert "gpushare_" not in anonymous.text
            assert "Authorization: Bearer" in anonymous.json()["reason"]
            tenant = await client.get("/metrics", headers=bearer("tenant-token"))
            assert tenant.status_code == 403
            assert TENANT.user in tenant.json()["reason"]
            assert (await client.get("/metrics", headers=bearer("forged"))).status_code == 401
            # another spelling of the path is guarded too
            assert (await client.get("/metrics/")).status_code == 401
            assert (await client.get("/")).status_code == 401
            served = await client.get("/metrics", headers=bearer("prom-token"))
            assert served.status_code == 200
            got = samples(served.text)
            assert "gpushare_gpu_memory_bytes" in {name for name, _ in got}, served.text[:500]
            assert got[("gpushare_metrics_scrapes_total", (("outcome", "forbidden"),))] == 1
            assert (await client.get("/healthz")).text == "ok"  # probes need no token
            for _ in range(5):
                await client.get("/metrics", headers=bearer("prom-token"))
        assert api.calls == {"token": 3, "access": 2}  # the cache answered the repeats

    run_with_rig(cluster(), body)


def https_get(url: str, token: str = "") -> tuple[int, str]:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the self-signed certificate, as the PodMonitor
    request = urllib.request.Request(url, headers=bearer(token) if token else {})
    try:
        with urllib.request.urlopen(request, context=context, timeout=5) as reply:
            return int(reply.status), reply.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_the_device_plugins_metrics_are_https_and_only_for_the_monitoring_identity(
    tmp_path: Path,
) -> None:
    kube = MemoryKube()
    plugin = DevicePlugin(
        api=kube,
        source=FakeGpus.parse("T4:15GiB", node="n1"),
        config=PluginConfig(node="n1", state_dir=tmp_path),
    )
    api = reviews()
    guard = MetricsGuard(api, ReviewCache())
    port = free_port()
    cert = self_signed("gpushare-device-plugin.n1")
    assert oct(cert.key_file.stat().st_mode & 0o777) == "0o600"
    serve_metrics(registry_for(plugin, "n1"), port=port, host="127.0.0.1", guard=guard, cert=cert)
    url = f"https://127.0.0.1:{port}"

    def scrapes() -> None:
        with pytest.raises(OSError):  # no plain HTTP: tokens never go in clear
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
        assert https_get(f"{url}/metrics")[0] == 401
        status, text = https_get(f"{url}/metrics", "tenant-token")
        assert status == 403 and "gpushare_" not in text
        # prometheus-client answers any path with the series: every path but /healthz is guarded
        assert https_get(f"{url}/anything")[0] == 401
        assert https_get(f"{url}/healthz") == (200, "ok")
        status, text = https_get(f"{url}/metrics", "prom-token")
        assert status == 200 and "gpushare_device_plugin_gpu_memory_bytes" in text
        only = f"{url}/metrics?name[]=gpushare_device_plugin_gpu_memory_bytes"
        status, text = https_get(only, "prom-token")
        assert status == 200 and "gpushare_build_info" not in text
        assert https_get(f"{url}/anything", "prom-token")[0] == 404

    asyncio.run(asyncio.to_thread(scrapes))
    assert guard.outcomes == {"unauthenticated": 2, "forbidden": 1, "allowed": 3}


def test_the_flags_refuse_half_a_certificate_and_a_certificate_without_authorization(
    tmp_path: Path,
) -> None:
    api = reviews()
    with pytest.raises(CommandError, match="--metrics-tls-cert-file was given alone"):
        metrics_access(api, enabled=True, cert_file="c", key_file=None, ttl_s=60, name="x")
    with pytest.raises(CommandError, match="drop them with --no-metrics-authorization"):
        metrics_access(api, enabled=False, cert_file="c", key_file="k", ttl_s=60, name="x")
    with pytest.raises(CommandError, match="cannot read"):
        metrics_access(
            api, enabled=True, cert_file=str(tmp_path / "c"), key_file="k", ttl_s=60, name="x"
        )
    assert metrics_access(api, enabled=False, cert_file=None, key_file=None, ttl_s=1, name="x") == (
        None,
        None,
    )
    guard, cert = metrics_access(
        api, enabled=True, cert_file=None, key_file=None, ttl_s=30, name="x"
    )
    assert guard is not None and cert is not None and cert.self_signed
    assert guard.cache.allowed_ttl_s == 30 and guard.cache.denied_ttl_s == 10
