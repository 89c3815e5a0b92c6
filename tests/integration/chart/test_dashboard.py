"""The Grafana dashboard: what it queries is exported, its totals are right, the chart ships it.

Two scheduler replicas run an extender each, and both export the per-GPU gauges from their own
cache. The totals test scrapes both (and a device plugin per node) into one sample set as
Prometheus would, each target with its own ``instance``, evaluates the dashboard's own panel
expressions on it (tests/support/promql.py) and compares them with the GPU memory the cluster has.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpushare.core.decision.scheduling import Settings
from gpushare.core.model.inventory import Mode
from gpushare.deviceplugin.config import PluginConfig
from gpushare.deviceplugin.metrics import DEVICE_PLUGIN_METRICS, registry_for
from gpushare.deviceplugin.plugin import DevicePlugin
from gpushare.extender.metrics import LEDGER_METRICS, ExtenderMetrics
from gpushare.kube.cache import ClusterCache
from gpushare.kube.memory import MemoryKube
from gpushare.kube.objects import gpu_node, gpu_pod
from gpushare.node.gpus import FakeGpus
from gpushare.webhook.app import WebhookMetrics
from tests.support.promql import Vector, labelled, merge, names_in, scrape
from tests.support.promqlengine import evaluate, evaluate_all, grafana, need_binary, parse_all
from tests.support.rig import rig_for

CHART = Path(__file__).parents[3] / "charts" / "gpushare"
DASHBOARD = CHART / "dashboards" / "gpushare.json"
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}
"""Series a family exposes besides its name (no ``_created``: gpushare.exporting drops it)."""


def exported(source: CollectorRegistry | str) -> set[str]:
    """Every series name a registry (or a /metrics text) can expose, including counter and
    histogram suffixes."""
    names = set()
    families = (
        text_string_to_metric_families(source) if isinstance(source, str) else source.collect()
    )
    for family in families:
        names.add(family.name)
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ()))
    return names


def targets(dashboard: dict[str, Any]) -> list[tuple[int, str, str]]:
    """(panel id, refId, expression) of every panel query."""
    out = [
        (p["id"], t["refId"], t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])
    ]
    assert out
    return out


def variable_queries(dashboard: dict[str, Any]) -> dict[str, str]:
    """The query of each template variable that asks Prometheus."""
    return {v["name"]: v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"}


def queried(dashboard: dict[str, Any]) -> set[str]:
    exprs = [expr for _, _, expr in targets(dashboard)]
    return names_in([*exprs, *variable_queries(dashboard).values()])


def test_every_metric_the_dashboard_queries_is_exported(tmp_path: Path) -> None:
    kube = MemoryKube()
    cache = ClusterCache(kube, settings=Settings())
    extender = exported(b"".join(asyncio.run(ExtenderMetrics(lambda: cache).exposition())).decode())
    plugin = DevicePlugin(
        api=kube,
        source=FakeGpus.parse("1x15GiB", node="n"),
        config=PluginConfig(node="n", state_dir=tmp_path),
    )
    device_plugin = exported(registry_for(plugin, "n"))
    webhook = exported(WebhookMetrics().registry)
    assert set(LEDGER_METRICS) <= extender and set(DEVICE_PLUGIN_METRICS) <= device_plugin
    assert "gpushare_build_info" in extender & device_plugin & webhook
    dashboard = json.loads(DASHBOARD.read_text())
    missing = queried(dashboard) - extender - device_plugin - webhook
    assert not missing, f"the dashboard queries series nobody exports: {sorted(missing)}"
    # the panels the issue asks for
    names = queried(dashboard)
    for wanted in (
        "gpushare_gpu_memory_allocated_bytes",
        "gpushare_gpu_memory_bytes",
        "gpushare_gpu_pods",
        "gpushare_extender_request_duration_seconds_bucket",
        "gpushare_bind_total",
        "gpushare_container_gpu_memory_used_bytes",
        "gpushare_container_gpu_memory_limit_bytes",
        "gpushare_namespace_gpu_memory_allocated_bytes",
        "gpushare_namespace_gpu_core_allocated",
        "gpushare_handoff_deferrals_total",
        "gpushare_gpu_unhealthy",
        "gpushare_device_plugin_gpu_unhealthy",
        "gpushare_build_info",
    ):
        assert wanted in names
    assert {p["id"] for p in dashboard["panels"]} == set(range(1, len(dashboard["panels"]) + 1))


def test_chart_ships_the_dashboard_as_a_labelled_configmap() -> None:
    from tests.support.chart import HELM, helm, template_args

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


NODE_SERIES = {
    m
    for m in (*LEDGER_METRICS, *DEVICE_PLUGIN_METRICS)
    if m != "gpushare_cache_synced" and not m.startswith("gpushare_namespace_")
}
"""Series with a ``node`` label: the node variable must filter every one."""


def test_every_panel_filters_by_the_namespace_and_node_variables() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    for name in ("namespace", "node"):
        assert variables[name]["includeAll"] and variables[name]["multi"]
        assert variables[name]["allValue"] == ".*"  # also matches series without the label
    assert '$namespace"' in variables["node"]["query"]
    for panel, ref, expr in targets(dashboard):
        selectors = re.findall(r"(gpushare_\w+)(\{[^}]*\})?", expr)
        assert selectors
        for name, matchers in selectors:
            where = f"panel {panel} {ref}: {name}"
            assert 'namespace=~"$namespace"' in matchers, where
            assert ('node=~"$node"' in matchers) == (name in NODE_SERIES), where


def test_per_node_table_shows_counts_as_numbers_and_memory_as_bytes() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    [table] = [p for p in dashboard["panels"] if p["title"] == "Per node"]
    [organize] = [t for t in table["transformations"] if t["id"] == "organize"]
    columns = organize["options"]["renameByName"]
    exprs = {t["refId"]: t["expr"] for t in table["targets"]}
    units = {
        o["matcher"]["options"]: {prop["id"]: prop["value"] for prop in o["properties"]}
        for o in table["fieldConfig"]["overrides"]
        if o["matcher"]["id"] == "byName"
    }
    default = table["fieldConfig"]["defaults"]["unit"]
    for ref, expr in exprs.items():
        column = columns[f"Value #{ref}"]
        unit = units.get(column, {}).get("unit", default)
        assert unit == ("bytes" if "_bytes" in expr else "none"), (column, unit)


GIB = 2**30
CLUSTER = {
    "node-a": dict(gpus_units=[15, 15]),
    "node-b": dict(gpus_units=[24, 24, 24, 24], model="A10"),
    "node-c": dict(gpus_units=[16], mode=Mode.CORE_MEM, model="A10"),
    "node-sick": dict(gpus_units=[15, 15], unhealthy=[1]),
}
"""GPU memory (GiB per GPU) the cluster has; the dashboard must add up to it."""
PODS = [("a", 3, None), ("b", 4, None), ("c", 10, None), ("d", 20, None), ("e", 4, 30)]
"""(name, GiB, computing power %) of the pods the leader binds."""
STRANGER_GIB = 2
"""A pod bound to node-a by another scheduler: memory held on no known GPU."""
NAMESPACE = {"namespace": "gpushare-system", "job": "gpushare"}


def cluster_memory(nodes: Iterable[str] = CLUSTER) -> float:
    return float(sum(sum(CLUSTER[n]["gpus_units"]) for n in nodes) * GIB)  # type: ignore[arg-type]


def two_replicas_scraped(tmp_path: Path) -> tuple[Vector, Vector]:
    """Both extenders' and every device plugin's /metrics: (first replica alone, everything)."""
    kube = MemoryKube()
    for name, spec in CLUSTER.items():
        kube.put_node(gpu_node(name, **spec))  # type: ignore[arg-type]
    pods = [kube.create_pod(gpu_pod(n, mem=m, core=c)) for n, m, c in PODS]
    stranger = gpu_pod("stranger", mem=STRANGER_GIB)  # bound by something else: no GPU known
    stranger["spec"]["nodeName"] = "node-a"
    kube.create_pod(stranger)

    async def main() -> tuple[Vector, Vector]:
        async with rig_for(kube) as leader, rig_for(kube) as follower:
            for pod in pods:
                assert (await leader.driver.schedule(pod, list(CLUSTER))).bound
            for _ in range(20):  # the follower learns the bindings from its watch
                await leader.settle()
            for name in CLUSTER:
                seen = [r.cache.state.ledger.usage(name).mem_units for r in (leader, follower)]
                assert seen[0] == seen[1], (name, seen)
            replicas = []
            for i, rig in enumerate((leader, follower)):
                text = (await rig.client.get("/metrics")).text
                target = {**NAMESPACE, "instance": f"10.0.0.{i + 1}:9401", "pod": f"sched-{i}"}
                replicas.append(scrape(text, target))
        return replicas[0], merge(*replicas)

    first, both = asyncio.run(main())
    plugins = []
    for i, (name, spec) in enumerate(CLUSTER.items()):
        source = FakeGpus.parse(
            ",".join(f"{spec.get('model', 'T4')}:{u}GiB" for u in spec["gpus_units"]),  # type: ignore[attr-defined]
            node=name,
        )
        for index in spec.get("unhealthy", []):  # type: ignore[attr-defined]
            source.set_health(index, False)
        plugin = DevicePlugin(
            api=kube, source=source, config=PluginConfig(node=name, state_dir=tmp_path)
        )
        text = generate_latest(registry_for(plugin, name)).decode()
        plugins.append(scrape(text, {**NAMESPACE, "instance": f"10.0.1.{i}:9400"}))
    return merge(first, *plugins), merge(both, *plugins)


ALL = {"namespace": ".*", "node": ".*"}
"""What Grafana puts in for a variable set to All (its allValue)."""


def panel(dashboard: dict[str, Any], title: str) -> dict[str, str]:
    [found] = [p for p in dashboard["panels"] if p["title"] == title]
    return {t["refId"]: t["expr"] for t in found["targets"]}


def scalar(value: Vector) -> float:
    assert len(value) == 1, value
    return next(iter(value.values()))


def test_with_two_scheduler_replicas_the_totals_equal_the_clusters_gpu_memory(
    tmp_path: Path,
) -> None:
    need_binary()
    _, samples = two_replicas_scraped(tmp_path)
    dashboard = json.loads(DASHBOARD.read_text())
    allocated = float(sum(m for _, m, _ in PODS) * GIB)
    # both replicas export every GPU: a plain sum would count each twice
    naive = evaluate("sum(gpushare_gpu_memory_bytes)", samples)
    assert scalar(naive) == 2 * cluster_memory()

    memory = panel(dashboard, "GPU memory, allocated and total")
    assert scalar(evaluate(memory["B"], samples, ALL)) == cluster_memory()
    assert scalar(evaluate(memory["A"], samples, ALL)) == allocated
    [ratio] = panel(dashboard, "GPU memory allocated").values()
    assert scalar(evaluate(ratio, samples, ALL)) == pytest.approx(allocated / cluster_memory())
    unhealthy = panel(dashboard, "Unhealthy GPUs")
    assert scalar(evaluate(unhealthy["A"], samples, ALL)) == 1
    assert scalar(evaluate(unhealthy["B"], samples, ALL)) == 1

    table = panel(dashboard, "Per node")
    total = labelled(evaluate(table["B"], samples, ALL), "node")
    assert total == {(n,): cluster_memory([n]) for n in CLUSTER}
    held = labelled(evaluate(table["A"], samples, ALL), "node")
    assert sum(held.values()) == allocated
    shares = labelled(evaluate(table["C"], samples, ALL), "node")
    assert sum(shares.values()) == len(PODS)
    assert labelled(evaluate(table["D"], samples, ALL), "node")[("node-sick",)] == 1
    unplaced = labelled(evaluate(table["E"], samples, ALL), "node")
    assert unplaced == {("node-a",): STRANGER_GIB * GIB}
    by_namespace = panel(dashboard, "GPU memory in use and allocated, per pod namespace")
    allocated_there = labelled(evaluate(by_namespace["B"], samples, ALL), "pod_namespace")
    assert allocated_there == {("default",): allocated}  # the stranger holds no known GPU

    # one node, then two, picked in the node variable (Grafana writes a regex alternation)
    picked = {"namespace": "gpushare-system", "node": "node-b"}
    assert scalar(evaluate(memory["B"], samples, picked)) == cluster_memory(["node-b"])
    picked["node"] = "(node-a|node-c)"
    assert scalar(evaluate(memory["B"], samples, picked)) == cluster_memory(["node-a", "node-c"])
    # another namespace's gpushare is not counted
    other = {"namespace": "elsewhere", "node": ".*"}
    assert evaluate(memory["B"], samples, other) == {}


def test_no_gauge_panel_changes_when_a_second_replica_reports_the_same_cluster(
    tmp_path: Path,
) -> None:
    need_binary()
    one, both = two_replicas_scraped(tmp_path)
    dashboard = json.loads(DASHBOARD.read_text())
    gauges = [
        (panel_id, ref, grafana(expr, ALL))
        for panel_id, ref, expr in targets(dashboard)
        # counters count calls, which only the replica called sees; build info
        if names_in([expr]) <= set(LEDGER_METRICS)
    ]
    assert len(gauges) >= 14
    answers = evaluate_all([(expr, s) for _, _, expr in gauges for s in (one, both)])
    for i, (panel_id, ref, expr) in enumerate(gauges):
        alone, with_both = answers[2 * i], answers[2 * i + 1]
        assert with_both == alone, f"panel {panel_id} {ref}: {expr}"
        assert alone, f"panel {panel_id} {ref} is empty: {expr}"


def test_every_expression_parses_with_prometheus() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    named = [(f"panel {p} {r}", grafana(e, ALL)) for p, r, e in targets(dashboard)]
    for name, query in variable_queries(dashboard).items():
        # label_values(selector, label) is Grafana's; Prometheus is asked for the selector
        selector = re.fullmatch(r"label_values\((.+), \w+\)", query)
        assert selector, query
        named.append((f"variable {name}", grafana(selector.group(1), ALL)))
    parse_all(named)


def test_rates_follow_grafanas_rate_interval() -> None:
    for panel_id, ref, expr in targets(json.loads(DASHBOARD.read_text())):
        for window in re.findall(r"\brate\([^\[]*\[([^\]]+)\]", expr):
            assert window == "$__rate_interval", f"panel {panel_id} {ref}: {expr}"


def test_every_stat_panel_has_thresholds_that_change_colour() -> None:
    stats = [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] == "stat"]
    assert stats
    for panel in stats:
        steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
        assert len(steps) >= 2 and steps[0]["value"] is None, panel["title"]
        assert len({s["color"] for s in steps}) == len(steps), panel["title"]
    [unhealthy] = [p for p in stats if p["title"] == "Unhealthy GPUs"]
    # one unhealthy GPU already shows red
    assert unhealthy["fieldConfig"]["defaults"]["thresholds"]["steps"][1] == {
        "color": "red",
        "value": 1,
    }
