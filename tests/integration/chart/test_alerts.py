"""The chart's PrometheusRule, on Prometheus's own engine: each alert fires when it should.

``promtool test rules`` would need promtool (23 minutes to build on 2 cores); the alerts'
expressions are run here instead through promqltest scripts (tests/support/promqlengine.py): series
loaded as the chart's PodMonitors would scrape them, then the alert's expression evaluated,
expecting exactly the label sets an alert would carry. What promqltest does not do is hold an
expression for the rule's ``for:`` before firing; that is Prometheus's rule manager, and the
value is checked by the chart tests, and by promtool in test_alert_rules.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.chart import HELM, NAMESPACE, RELEASE, find, render
from tests.support.promqlengine import need_binary, parse_all, run_scripts

pytestmark = pytest.mark.skipif(HELM is None, reason="helm not built: run `make controlplane`")

WEBHOOK_JOB = f"{NAMESPACE}/{RELEASE}-webhook"
SCHEDULER_JOB = f"{NAMESPACE}/{RELEASE}-scheduler"
TARGET = f'namespace="{NAMESPACE}"'

CASES: dict[str, list[tuple[str, list[str]]]] = {
    # (the series loaded, one a line, over 15 minutes; the label sets expected to fire at 15m)
    "GPUShareWebhookDown": [
        (
            f'up{{job="{WEBHOOK_JOB}", pod="w-0"}} 0x15\nup{{job="{WEBHOOK_JOB}", pod="w-1"}} 0x15',
            ["{}"],
        ),
        (
            f'up{{job="{WEBHOOK_JOB}", pod="w-0"}} 0x15\nup{{job="{WEBHOOK_JOB}", pod="w-1"}} 1x15',
            [],
        ),
        ('up{job="elsewhere"} 1x15', [f'{{job="{WEBHOOK_JOB}"}}']),
    ],
    "GPUShareExtenderDown": [
        (f'up{{job="{SCHEDULER_JOB}", pod="s-0"}} 0x15', ["{}"]),
        (f'up{{job="{SCHEDULER_JOB}", pod="s-0"}} 1x15', []),
        ('up{job="elsewhere"} 1x15', [f'{{job="{SCHEDULER_JOB}"}}']),
    ],
    "GPUShareWebhookCertificateNotReloaded": [
        (
            f'gpushare_webhook_certificate_reloads_total{{{TARGET}, pod="w-0", result="failed"}} '
            "0x5 1x10\n"
            f'gpushare_webhook_certificate_reloads_total{{{TARGET}, pod="w-1", result="failed"}} '
            "2x15",
            [f'{{{TARGET}, pod="w-0", result="failed"}}'],
        ),
    ],
    "GPUShareExtenderCacheNotSynced": [
        (
            f'gpushare_cache_synced{{{TARGET}, pod="s-0"}} 0x15\n'
            f'gpushare_cache_synced{{{TARGET}, pod="s-1"}} 1x15',
            ['{pod="s-0"}'],
        ),
    ],
    "GPUShareUntrustedAllocations": [
        (
            f'gpushare_untrusted_allocations_total{{{TARGET}, pod="s-0", reason="unsealed"}} '
            "0x5 1x10\n"
            f'gpushare_untrusted_allocations_total{{{TARGET}, pod="s-1", reason="unsealed"}} '
            "0x5 1x10\n"
            f'gpushare_untrusted_allocations_total{{{TARGET}, pod="s-0", reason="mismatch"}} 4x15',
            ['{reason="unsealed"}'],
        ),
    ],
    "GPUShareGPUUnhealthy": [
        (  # both scheduler replicas report it: one alert
            f'gpushare_gpu_unhealthy{{{TARGET}, pod="s-0", node="a", gpu="1", model="T4"}} 1x15\n'
            f'gpushare_gpu_unhealthy{{{TARGET}, pod="s-1", node="a", gpu="1", model="T4"}} 1x15\n'
            f'gpushare_gpu_unhealthy{{{TARGET}, pod="s-0", node="a", gpu="0", model="T4"}} 0x15',
            ['{node="a", gpu="1"}'],
        ),
    ],
    "GPUShareExtenderWatchRefused": [
        (  # one replica refused, the other not: the refused one alone
            f'gpushare_watch_refused{{{TARGET}, pod="s-0", resource="pods", verb="watch", '
            'reason="forbidden"} 1x15\n'
            f'gpushare_build_info{{{TARGET}, pod="s-1"}} 1x15',
            ['{pod="s-0", resource="pods", verb="watch", reason="forbidden"}'],
        ),
        (f'gpushare_build_info{{{TARGET}, pod="s-0"}} 1x15', []),
    ],
    "GPUShareDevicePluginWatchRefused": [
        (
            "gpushare_device_plugin_watch_refused"
            f'{{{TARGET}, pod="dp-a", node="a", resource="pods", verb="watch", '
            'reason="forbidden"} 1x15\n'
            "gpushare_device_plugin_watch_refused"
            f'{{{TARGET}, pod="dp-b", node="b", resource="pods", verb="list", '
            'reason="failing"} 0x15',
            ['{node="a", resource="pods", verb="watch", reason="forbidden"}'],
        ),
    ],
    "GPUShareDevicePluginMissing": [
        (  # both extender replicas report gpu-a: one alert; nodeModes keeps mps, drops none
            "gpushare_node_device_plugin_missing"
            f'{{{TARGET}, pod="s-0", node="a", mode="share", reason="unpublished"}} 1x15\n'
            "gpushare_node_device_plugin_missing"
            f'{{{TARGET}, pod="s-1", node="a", mode="share", reason="unpublished"}} 1x15\n'
            "gpushare_node_device_plugin_missing"
            f'{{{TARGET}, pod="s-0", node="b", mode="other", reason="unpublished"}} 1x15',
            ['{node="a", mode="share", reason="unpublished"}'],
        ),
        (f'gpushare_build_info{{{TARGET}, pod="s-0"}} 1x15', []),
    ],
    "GPUShareDevicePluginAllocationFailures": [
        (
            "gpushare_device_plugin_allocation_failures_total"
            f'{{{TARGET}, pod="dp-a", node="a"}} 0x5 1x10\n'
            "gpushare_device_plugin_allocation_failures_total"
            f'{{{TARGET}, pod="dp-b", node="b"}} 0x15',
            ['{node="a"}'],
        ),
    ],
    "GPUShareBrokerConnectionsRefused": [
        (
            "gpushare_device_plugin_broker_connections_refused_total"
            f'{{{TARGET}, pod="dp-a", node="a", cap="pod"}} 0x5 2x10\n'
            "gpushare_device_plugin_broker_connections_refused_total"
            f'{{{TARGET}, pod="dp-a", node="a", cap="node"}} 0x15',
            ['{node="a", cap="pod"}'],
        ),
    ],
    "GPUSharePodResourcesMismatch": [
        (
            "gpushare_device_plugin_podresources_mismatches_total"
            f'{{{TARGET}, pod="dp-a", node="a"}} 0x5 1x10\n'
            "gpushare_device_plugin_podresources_mismatches_total"
            f'{{{TARGET}, pod="dp-b", node="b"}} 0x15',
            ['{pod="dp-a"}'],
        ),
    ],
}


def alerts() -> dict[str, dict[str, Any]]:
    docs = render("--set", "prometheusRule.enabled=true", "--set", "podMonitor.enabled=true")
    (group,) = find(docs, "PrometheusRule")["spec"]["groups"]
    return {r["alert"]: r for r in group["rules"]}


def script(expr: str, cases: list[tuple[str, list[str]]]) -> str:
    out = []
    for series, firing in cases:
        out += ["clear", "load 1m", *(f"  {line}" for line in series.splitlines()), ""]
        # an alert carries the expression's labels; the value does not matter
        out.append(f"eval instant at 15m ({expr}) * 0 + 1")
        out += [f"  {labels} 1" for labels in firing]
        out.append("")
    return "\n".join(out)


def test_every_alert_parses_and_has_cases() -> None:
    need_binary()
    rules = alerts()
    assert set(rules) == set(CASES)
    parse_all((name, rule["expr"]) for name, rule in rules.items())


def test_each_alert_fires_on_its_cases_and_only_there() -> None:
    need_binary()
    rules = alerts()
    run_scripts({name: script(rules[name]["expr"], cases) for name, cases in CASES.items()})
