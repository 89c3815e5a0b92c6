"""The chart's DRA driver: off by default; with ``dra.enabled`` a DaemonSet on DRA nodes with
kubelet's plugin directories and the CDI directory, flags the command takes, and RBAC as narrow
as its calls; the device plugin keeps off DRA nodes."""

from __future__ import annotations

import re
from typing import Any

import pytest
from click.testing import CliRunner

from gpushare.cli import main as cli
from tests.support.chart import find, needs_helm, render

pytestmark = needs_helm

ON = ("--set", "dra.enabled=true")


@pytest.fixture(scope="module")
def dra_docs() -> list[dict[str, Any]]:
    return render(*ON)


def test_off_by_default() -> None:
    assert not [d for d in render() if "dra-driver" in d["metadata"]["name"]]


def test_the_device_plugin_keeps_off_dra_nodes() -> None:
    pod = find(render(), "DaemonSet", "-device-plugin")["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    expressions = terms["nodeSelectorTerms"][0]["matchExpressions"]
    assert {"key": "gpushare.io/allocation-mode", "operator": "NotIn", "values": ["dra"]} in (
        expressions
    )


def test_the_driver_runs_on_dra_nodes_with_kubelets_directories(
    dra_docs: list[dict[str, Any]],
) -> None:
    daemonset = find(dra_docs, "DaemonSet", "-dra-driver")
    pod = daemonset["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"] == [
        {"key": "gpushare.io/allocation-mode", "operator": "In", "values": ["dra"]}
    ]
    assert pod["serviceAccountName"].endswith("-dra-driver")
    [container] = pod["containers"]
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {
        "/var/lib/kubelet/plugins",
        "/var/lib/kubelet/plugins_registry",
        "/var/run/cdi",
        "/var/lib/gpushare",
    } <= mounts
    hosts = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert {"/var/lib/kubelet/plugins", "/var/lib/kubelet/plugins_registry"} <= hosts
    args = container["args"]
    assert args[0] == "dra-driver"
    assert "--plugins-dir=/var/lib/kubelet/plugins" in args
    assert "--registry-dir=/var/lib/kubelet/plugins_registry" in args
    assert "--gpu-memory-unit=1GiB" in args


def test_the_drivers_flags_exist_and_parse(
    dra_docs: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    [container] = find(dra_docs, "DaemonSet", "-dra-driver")["spec"]["template"]["spec"][
        "containers"
    ]
    command, *args = container["args"]
    help_text = CliRunner().invoke(cli, [command, "--help"]).output
    for arg in args:
        flag = arg.split("=")[0]
        assert re.search(rf"{re.escape(flag)}\b", help_text), f"gpushare {command} {flag}"
    for variable in container.get("env", []):
        monkeypatch.setenv(variable["name"], variable.get("value", "from-the-downward-api"))
    with cli.commands[command].make_context(command, args) as context:
        assert context.params["node_name"]


def test_rbac_is_as_narrow_as_the_calls(dra_docs: list[dict[str, Any]]) -> None:
    role = find(dra_docs, "ClusterRole", "-dra-driver")
    rules = {
        (group, resource): set(rule["verbs"])
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert rules == {
        ("", "nodes"): {"get"},
        ("resource.k8s.io", "resourceslices"): {
            "get",
            "list",
            "watch",
            "create",
            "update",
            "delete",
        },
        ("resource.k8s.io", "resourceclaims"): {"get"},
        ("", "pods"): {"get"},
    }
    binding = find(dra_docs, "ClusterRoleBinding", "-dra-driver")
    assert binding["subjects"][0]["name"].endswith("-dra-driver")
