"""The chart's PrometheusRule under ``promtool``: rules checked, and alerts fired over time.

``promtool check rules`` lints the rendered groups, and ``promtool test rules`` loads series
for the failing and the healthy case of each new alert and asks which alerts are firing at a
time, with their labels and annotations: unlike the promqltest scripts of test_alerts.py, it
holds an expression for the rule's ``for:`` and expands the annotations' templates, so the
grace period and the runbook links are tested too. promtool is Debian's (build.sh's
``install_promtool``); the version is printed with the results.

Also here: every alert has a ``runbook_url`` whose anchor docs/runbooks.md has, and the two
"down" alerts, which read ``up`` of this chart's PodMonitors, are rendered only with
``podMonitor.enabled`` (before, with ``prometheusRule.enabled`` alone, their ``absent()`` fired
for as long as the rule existed: nothing scraped under those job names).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.chart import HELM, NAMESPACE, RELEASE, REPO, find, render

pytestmark = pytest.mark.skipif(HELM is None, reason="helm not built: run `make controlplane`")

RUNBOOKS = REPO / "docs" / "runbooks.md"
ON = ("--set", "prometheusRule.enabled=true", "--set", "podMonitor.enabled=true")
TARGET = f'namespace="{NAMESPACE}"'


def promtool() -> Path:
    """build.sh's promtool, else one on PATH, else a skip saying how to get it."""
    cache = Path(os.environ.get("GPUSHARE_CACHE", Path.home() / ".cache" / "gpushare")) / "bin"
    for found in sorted(cache.glob("promtool-*/promtool")):
        if os.access(found, os.X_OK):
            return found
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        found = Path(folder) / "promtool"
        if found.is_file() and os.access(found, os.X_OK):
            return found
    pytest.skip("promtool not here: run `make controlplane` (build.sh install_promtool)")


def rules(*values: str) -> list[dict[str, Any]]:
    docs = render(*ON, *values)
    (group,) = find(docs, "PrometheusRule")["spec"]["groups"]
    rules: list[dict[str, Any]] = group["rules"]
    return rules


def by_name(*values: str) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for r in rules(*values)}


def expanded(rule: dict[str, Any], labels: dict[str, str]) -> dict[str, str]:
    """The rule's annotations as Prometheus expands them for an alert with these labels."""

    def fill(text: str) -> str:
        return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m[1], ""), text)

    return {k: fill(v) for k, v in rule["annotations"].items()}


def run_promtool(tmp_path: Path, rules: list[dict[str, Any]], tests: list[dict[str, Any]]) -> str:
    """``promtool check rules`` and ``promtool test rules`` on the chart's rules; the output."""
    group = {"name": "gpushare", "rules": rules}
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": [group]}))
    (tmp_path / "tests.yaml").write_text(
        yaml.safe_dump(
            {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests},
            sort_keys=False,
        )
    )
    tool = str(promtool())
    checked = subprocess.run(
        [tool, "check", "rules", "rules.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run(
        [tool, "test", "rules", "tests.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    version = subprocess.run([tool, "--version"], capture_output=True, text=True).stdout
    out = f"{version.splitlines()[0]}\n{checked.stdout}{tested.stdout}{tested.stderr}"
    print(out)
    assert tested.returncode == 0, out
    return out


def alert(rule: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    return {
        "exp_labels": {**labels, **rule["labels"]},
        "exp_annotations": expanded(rule, labels),
    }


def test_new_alerts_fire_after_their_grace_and_not_on_healthy_series(tmp_path: Path) -> None:
    found = by_name()
    missing = found["GPUShareDevicePluginMissing"]
    failures = found["GPUShareDevicePluginAllocationFailures"]
    refused = found["GPUShareBrokerConnectionsRefused"]
    assert missing["for"] == "15m"
    node_a = {"node": "gpu-a", "mode": "share", "reason": "unregistered"}
    series = [
        # two extender replicas report node gpu-a from minute 0: one alert, after 15 minutes
        *(
            {
                "series": f'gpushare_node_device_plugin_missing{{{TARGET}, pod="s-{i}", '
                'node="gpu-a", mode="share", reason="unregistered"}',
                "values": "1x40",
            }
            for i in (0, 1)
        ),
        # gpu-b: a new node whose plugin registered after 10 minutes (the series goes): none
        {
            "series": f'gpushare_node_device_plugin_missing{{{TARGET}, pod="s-0", '
            'node="gpu-b", mode="cgpu", reason="unpublished"}',
            "values": "1x10 _x30",
        },
        # Allocate refused once at minute 20 on gpu-a; gpu-b's plugin never refused
        {
            "series": f'gpushare_device_plugin_allocation_failures_total{{{TARGET}, pod="dp-a", '
            'node="gpu-a"}',
            "values": "0x20 1x20",
        },
        {
            "series": f'gpushare_device_plugin_allocation_failures_total{{{TARGET}, pod="dp-b", '
            'node="gpu-b"}',
            "values": "0x40",
        },
        # the broker's pod cap met on gpu-a at minute 20; its node cap never
        {
            "series": "gpushare_device_plugin_broker_connections_refused_total"
            f'{{{TARGET}, pod="dp-a", node="gpu-a", cap="pod"}}',
            "values": "0x20 3x20",
        },
        {
            "series": "gpushare_device_plugin_broker_connections_refused_total"
            f'{{{TARGET}, pod="dp-a", node="gpu-a", cap="node"}}',
            "values": "0x40",
        },
    ]

    def at(minute: int, rule: dict[str, Any], firing: list[dict[str, str]]) -> dict[str, Any]:
        return {
            "eval_time": f"{minute}m",
            "alertname": rule["alert"],
            "exp_alerts": [alert(rule, labels) for labels in firing],
        }

    tests = [
        {
            "interval": "1m",
            "input_series": series,
            "alert_rule_test": [
                at(14, missing, []),  # pending: within the grace period
                at(16, missing, [node_a]),
                at(39, missing, [node_a]),
                at(19, failures, []),
                at(21, failures, [{"node": "gpu-a"}]),
                at(19, refused, []),
                at(21, refused, [{"node": "gpu-a", "cap": "pod"}]),
            ],
        }
    ]
    run_promtool(tmp_path, rules(), tests)


def test_a_node_mode_the_plugin_does_not_serve_raises_no_alert(tmp_path: Path) -> None:
    """With devicePlugin.nodeModes narrowed to share, a cgpu node has no plugin by design."""
    found = by_name("--set-json", 'devicePlugin.nodeModes=["share"]')
    missing = found["GPUShareDevicePluginMissing"]
    series = [
        {
            "series": f'gpushare_node_device_plugin_missing{{{TARGET}, pod="s-0", '
            f'node="gpu-{mode}", mode="{mode}", reason="unpublished"}}',
            "values": "1x40",
        }
        for mode in ("share", "cgpu")
    ]
    firing = [{"node": "gpu-share", "mode": "share", "reason": "unpublished"}]
    tests = [
        {
            "interval": "1m",
            "input_series": series,
            "alert_rule_test": [
                {
                    "eval_time": "30m",
                    "alertname": missing["alert"],
                    "exp_alerts": [alert(missing, labels) for labels in firing],
                }
            ],
        }
    ]
    run_promtool(tmp_path, rules("--set-json", 'devicePlugin.nodeModes=["share"]'), tests)


def test_down_alerts_need_the_chart_s_pod_monitors(tmp_path: Path) -> None:
    """Rendered without podMonitor.enabled they would fire for ever (nothing is scraped under
    the job names they read); rendered with it, they fire on a down target after downFor and
    stay quiet while one replica answers."""
    docs = render("--set", "prometheusRule.enabled=true")
    (group,) = find(docs, "PrometheusRule")["spec"]["groups"]
    alone = {r["alert"] for r in group["rules"]}
    assert not {"GPUShareWebhookDown", "GPUShareExtenderDown"} & alone
    assert not [r for r in group["rules"] if "absent(" in r["expr"]]
    assert "GPUShareDevicePluginMissing" in alone
    found = by_name()
    webhook, extender = found["GPUShareWebhookDown"], found["GPUShareExtenderDown"]
    job = f"{NAMESPACE}/{RELEASE}"
    series = [
        {"series": f'up{{job="{job}-webhook", pod="w-0"}}', "values": "0x20"},
        {"series": f'up{{job="{job}-webhook", pod="w-1"}}', "values": "0x20"},
        {"series": f'up{{job="{job}-scheduler", pod="s-0"}}', "values": "0x20"},
        {"series": f'up{{job="{job}-scheduler", pod="s-1"}}', "values": "1x20"},
    ]
    tests = [
        {
            "interval": "1m",
            "input_series": series,
            "alert_rule_test": [
                {"eval_time": "4m", "alertname": webhook["alert"], "exp_alerts": []},
                {
                    "eval_time": "6m",
                    "alertname": webhook["alert"],
                    "exp_alerts": [alert(webhook, {})],
                },
                {"eval_time": "10m", "alertname": extender["alert"], "exp_alerts": []},
            ],
        }
    ]
    run_promtool(tmp_path, rules(), tests)


def test_every_alert_links_its_runbook_section() -> None:
    base = "https://github.com/gpushare/gpushare/blob/main/docs/runbooks.md"
    headings = {
        line[3:].strip() for line in RUNBOOKS.read_text().splitlines() if line.startswith("## ")
    }
    found = by_name()
    for name, rule in found.items():
        assert rule["annotations"]["runbook_url"] == f"{base}#{name.lower()}", name
        assert name in headings, f"docs/runbooks.md has no section '## {name}'"
    assert headings <= set(found) | {"Before any alert"}
    mine = by_name("--set", "prometheusRule.runbookUrl=https://wiki.example/gpushare")
    assert mine["GPUShareGPUUnhealthy"]["annotations"]["runbook_url"] == (
        "https://wiki.example/gpushare#gpusharegpuunhealthy"
    )
