"""``--explain`` takes the installed extender's settings from the chart's Deployment."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpushare.core.decision.scheduling import Settings
from gpushare.core.model.units import MemoryUnit
from gpushare.inspect.cli import (
    CannotExplain,
    collect_explanation,
    installed_extender,
    installed_settings,
)
from gpushare.inspect.installed import extender_settings, flag_values, placeholder_namespace
from gpushare.inspect.newnode import PlaceholderSight
from gpushare.kube.memory import MemoryKube
from tests.support.chart import HELM, NAMESPACE, find, render
from tests.support.kubeconfigs import kube_with_pods

needs_helm = pytest.mark.skipif(HELM is None, reason="helm is not installed (make controlplane)")


def test_flags_in_both_spellings_and_the_last_wins() -> None:
    args = ["--policy=binpack", "--gpu-memory-unit", "128MiB", "--port=1", "--policy", "spread"]
    assert flag_values(args) == {"policy": "spread", "gpu_memory_unit": "128MiB"}


def deployment(*args: str, name: str = "gpushare-scheduler") -> dict[str, Any]:
    containers = [
        {"name": "kube-scheduler", "command": ["kube-scheduler", "--config=/x"]},
        {"name": "extender", "args": ["extender", *args]},
    ]
    return {
        "metadata": {"namespace": "gpushare", "name": name},
        "spec": {"template": {"spec": {"containers": containers}}},
    }


def test_a_flag_the_extender_would_refuse_is_refused() -> None:
    with pytest.raises(ValueError, match="gpu_memory_unit='2GiB'"):
        extender_settings([deployment("--gpu-memory-unit=2GiB")], "gpushare")


def test_explain_uses_the_installed_settings_and_says_when_it_cannot() -> None:
    kube = kube_with_pods()
    kube.put_deployment(deployment("--policy=spread", "--max-pods-per-gpu=4"))
    settings, note = asyncio.run(installed_settings(kube, "gpushare"))
    assert (settings.policy, settings.max_pods_per_gpu) == ("spread", 4)
    assert "Deployment gpushare/gpushare-scheduler (policy spread" in note
    kube.forbidden.add("list_deployments:gpushare")
    fallback, note = asyncio.run(installed_settings(kube, "gpushare"))
    assert fallback == Settings() and fallback.policy == "gpushare"
    assert "cannot read the installed extender's settings" in note and "forbidden" in note
    _, note = asyncio.run(installed_settings(MemoryKube(), "elsewhere"))
    assert "no Deployment in namespace elsewhere runs the gpushare extender" in note


def test_explain_reads_where_the_extender_keeps_placeholders() -> None:
    assert placeholder_namespace([deployment("--placeholder-namespace=gpushare")]) == "gpushare"
    assert placeholder_namespace([deployment("--placeholder-namespace", "a", "--policy=x")]) == "a"
    assert placeholder_namespace([deployment("--policy=spread")]) == ""  # it keeps none
    assert placeholder_namespace([]) is None
    kube = kube_with_pods()
    kube.put_deployment(deployment("--placeholder-namespace=gpushare"))
    on = asyncio.run(installed_extender(kube, "gpushare"))
    assert on.placeholders == PlaceholderSight(namespace="gpushare")
    kube.forbidden.add("list_deployments:gpushare")
    unread = asyncio.run(installed_extender(kube, "gpushare"))
    assert unread.placeholders == PlaceholderSight(namespace="gpushare", known=False)


def test_explain_without_cluster_rights_says_what_it_needs() -> None:
    kube = kube_with_pods()
    kube.forbidden.add("list_nodes")
    with pytest.raises(CannotExplain, match="needs every node and every pod"):
        asyncio.run(collect_explanation(kube, "ml", "small", settings=Settings()))


@needs_helm
def test_the_chart_s_deployment_gives_its_values() -> None:
    docs = render("--set", "policy=binpack", "--set", "gpuMemoryUnit=128MiB")
    scheduler = find(docs, "Deployment", "-scheduler")
    settings, where = extender_settings([scheduler], NAMESPACE)
    assert (settings.policy, settings.unit) == ("binpack", MemoryUnit.MiB128)
    assert where.startswith(f"Deployment {NAMESPACE}/")
    role = find(docs, "ClusterRole", "-inspect")
    assert role["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert {r["resources"][0] for r in role["rules"]} == {
        "pods",
        "resourcepolicies",
        "resourceclaims",  # DRA mode's shares, in the namespace
    }
    nodes = find(docs, "ClusterRole", "-inspect-nodes")["rules"]
    assert [r["resources"] for r in nodes] == [["nodes"], ["resourceslices"]]


@needs_helm
def test_the_chart_s_autoscaling_values_reach_explain() -> None:
    on = find(render(), "Deployment", "-scheduler")
    assert placeholder_namespace([on]) == NAMESPACE  # autoscaling.placeholders: true (default)
    off = find(render("--set", "autoscaling.placeholders=false"), "Deployment", "-scheduler")
    assert placeholder_namespace([off]) == ""
