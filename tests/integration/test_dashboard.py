"""The Grafana dashboard queries only series gpushare exports, and the chart ships it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from gpushare.core.scheduling import Settings
from gpushare.deviceplugin.config import PluginConfig
from gpushare.deviceplugin.gpus import FakeGpus
from gpushare.deviceplugin.metrics import DEVICE_PLUGIN_METRICS, registry_for
from gpushare.deviceplugin.plugin import DevicePlugin
from gpushare.extender.metrics import LEDGER_METRICS, ExtenderMetrics
from gpushare.kube.cache import ClusterCache
from gpushare.kube.memory import MemoryKube

CHART = Path(__file__).parents[2] / "charts" / "gpushare"
DASHBOARD = CHART / "dashboards" / "gpushare.json"
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum")}


def exported(registry: CollectorRegistry) -> set[str]:
    """Every series name a registry can expose, including counter and histogram suffixes."""
    names = set()
    for family in registry.collect():
        names.add(family.name)
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ()))
    return names


def queried(dashboard: dict[str, Any]) -> set[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert exprs
    return {name for expr in exprs for name in re.findall(r"gpushare_\w+", expr)}


def test_every_metric_the_dashboard_queries_is_exported(tmp_path: Path) -> None:
    kube = MemoryKube()
    cache = ClusterCache(kube, settings=Settings())
    extender = exported(ExtenderMetrics(lambda: cache).registry)
    plugin = DevicePlugin(
        api=kube,
        source=FakeGpus.parse("1x15GiB", node="n"),
        config=PluginConfig(node="n", state_dir=tmp_path),
    )
    device_plugin = exported(registry_for(plugin, "n"))
    assert set(LEDGER_METRICS) <= extender and set(DEVICE_PLUGIN_METRICS) <= device_plugin
    dashboard = json.loads(DASHBOARD.read_text())
    missing = queried(dashboard) - extender - device_plugin
    assert not missing, f"the dashboard queries series nobody exports: {sorted(missing)}"
    # the panels the issue asks for
    names = queried(dashboard)
    for wanted in (
        "gpushare_gpu_memory_allocated_bytes",
        "gpushare_gpu_memory_bytes",
        "gpushare_gpu_pods",
        "gpushare_extender_request_duration_seconds_bucket",
        "gpushare_bind_conflicts_total",
        "gpushare_handoff_deferrals_total",
        "gpushare_gpu_unhealthy",
        "gpushare_device_plugin_gpu_unhealthy",
    ):
        assert wanted in names
    assert {p["id"] for p in dashboard["panels"]} == set(range(1, len(dashboard["panels"]) + 1))


def test_chart_ships_the_dashboard_as_a_labelled_configmap() -> None:
    from .test_chart import HELM, helm, template_args

    if HELM is None:
        pytest.skip("helm not built")
    docs = [d for d in yaml.safe_load_all(helm(*template_args()).stdout) if d]
    [config] = [
        d
        for d in docs
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboards")
    ]
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config["data"]["gpushare.json"]) == json.loads(DASHBOARD.read_text())
    off = helm(*template_args(), "--set", "dashboards.enabled=false").stdout
    assert "grafana_dashboard" not in off
    args = {
        c["name"]: c.get("args", [])
        for d in docs
        if d["kind"] in ("Deployment", "DaemonSet")
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    assert "--metrics-port=9401" in args["extender"]
    assert "--metrics-port=9400" in args["device-plugin"]
