"""The chart's platform presets (``platform``; docs/platforms.md) and the values they set.

Each preset (charts/gpushare/platforms/<platform>.yaml) fills the values left null in
values.yaml; a value the user sets wins. What each platform needs is the vendor's word, cited in
the preset files and ../shared/docs/PLATFORMS.md ([Sn] there); what these tests prove is what
the chart renders from it: per platform, the device plugin's privilege, runtime class, hand-off,
library path, kubelet configuration and SELinux label, the webhook's tolerations, the
priority-class quota (GKE [S6]) and OpenShift's SCC bindings (test_openshift.py checks those
pods against the SCCs' rules).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.core.admitting.tolerations import parse_toleration
from tests.support.chart import (
    CHART,
    NAMESPACE,
    RELEASE,
    find,
    helm,
    needs_helm,
    render,
    render_notes,
    template_args,
)

pytestmark = needs_helm

PLATFORMS = ["", "gke", "eks", "bottlerocket", "aks", "openshift", "k3s", "rke2"]

GKE_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}

GENERIC: dict[str, Any] = {
    "privileged": False,
    "runtimeClassName": None,
    "deviceListStrategy": "cdi-cri",
    "libDir": "/usr/local/gpushare",
    "kubeletConfig": None,
    "seLinuxOptions": None,
    "steerTolerations": [],
    "quotaClasses": None,
    "fixedUids": True,
    "sccBindings": {},
}
"""What the chart rendered before presets existed, and still renders with ``platform: ""``."""

OPENSHIFT_BINDINGS = {
    f"{RELEASE}-device-plugin": "privileged",
    f"{RELEASE}-scheduler": "restricted-v2",
    f"{RELEASE}-seal": "restricted-v2",
    f"{RELEASE}-webhook": "restricted-v2",
    f"{RELEASE}-webhook-certs": "restricted-v2",
}

EXPECTED: dict[str, dict[str, Any]] = {
    "": GENERIC,
    "gke": GENERIC
    | {
        "privileged": True,
        "deviceListStrategy": "driver-root",
        "libDir": "/home/kubernetes/bin/gpushare",
        "kubeletConfig": "/home/kubernetes/kubelet-config.yaml",
        "steerTolerations": [GKE_TOLERATION],
        "quotaClasses": ["system-cluster-critical", "system-node-critical"],
    },
    "eks": GENERIC,
    "bottlerocket": GENERIC
    | {
        "privileged": True,
        "libDir": "/var/lib/gpushare-lib",
        "seLinuxOptions": {"type": "super_t"},
    },
    "aks": GENERIC,
    "openshift": GENERIC
    | {
        "privileged": True,
        "runtimeClassName": "nvidia",
        "fixedUids": False,
        "sccBindings": OPENSHIFT_BINDINGS,
    },
    "k3s": GENERIC | {"runtimeClassName": "nvidia"},
    "rke2": GENERIC | {"runtimeClassName": "nvidia"},
}


def _flag(args: list[str], name: str) -> str | None:
    found = [a.split("=", 1)[1] for a in args if a.startswith(f"{name}=")]
    assert len(found) <= 1, found
    return found[0] if found else None


def _uids(spec: dict[str, Any]) -> set[str]:
    context = spec.get("securityContext") or {}
    return {key for key in ("runAsUser", "runAsGroup", "fsGroup") if key in context}


def observed(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The preset-sensitive settings as the rendered objects carry them."""
    plugin = find(docs, "DaemonSet", "-device-plugin")["spec"]["template"]["spec"]
    (container,) = plugin["containers"]
    args = container["args"]
    security = container["securityContext"]
    volumes = {v["name"]: v for v in plugin["volumes"]}
    webhook = find(docs, "Deployment", "-webhook")["spec"]["template"]["spec"]
    steer = [
        json.loads(a.split("=", 1)[1])
        for a in webhook["containers"][0]["args"]
        if a.startswith("--steer-toleration=")
    ]
    quotas = [d for d in docs if d["kind"] == "ResourceQuota"]
    classes = None
    if quotas:
        (quota,) = quotas
        (expression,) = quota["spec"]["scopeSelector"]["matchExpressions"]
        assert expression["scopeName"] == "PriorityClass" and expression["operator"] == "In"
        classes = expression["values"]
    jobs = {
        d["metadata"]["labels"]["app.kubernetes.io/component"]: d["spec"]["template"]["spec"]
        for d in docs
        if d["kind"] == "Job"
    }
    (test_pod,) = [d for d in docs if d["metadata"]["name"] == f"{RELEASE}-test"]
    workloads = [
        find(docs, "Deployment", "-scheduler")["spec"]["template"]["spec"],
        webhook,
        jobs["seal"],
        jobs["webhook-certs"],
        test_pod["spec"],
    ]
    fixed = [bool(_uids(spec)) for spec in workloads]
    assert len(set(fixed)) == 1, f"some non-root pods fix uids and some do not: {fixed}"
    roles = {
        d["metadata"]["name"]: d["rules"][0]["resourceNames"][0]
        for d in docs
        if d["kind"] == "ClusterRole" and d["metadata"]["name"].startswith(f"{RELEASE}-scc-")
    }
    bindings = {
        d["subjects"][0]["name"]: roles[d["roleRef"]["name"]]
        for d in docs
        if d["kind"] == "RoleBinding" and d["roleRef"]["name"] in roles
    }
    return {
        "privileged": security["privileged"],
        "runtimeClassName": plugin.get("runtimeClassName"),
        "deviceListStrategy": _flag(args, "--device-list-strategy"),
        "libDir": _flag(args, "--isolation-lib-dir"),
        "kubeletConfig": volumes["kubelet-config"]["hostPath"]["path"]
        if "kubelet-config" in volumes
        else None,
        "seLinuxOptions": security.get("seLinuxOptions"),
        "steerTolerations": steer,
        "quotaClasses": classes,
        "fixedUids": fixed[0],
        "sccBindings": bindings,
    }


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {platform: render("--set", f"platform={platform}") for platform in PLATFORMS}


@pytest.mark.parametrize("platform", PLATFORMS, ids=lambda p: p or "none")
def test_each_preset_renders_what_its_platform_needs(
    platform: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    docs = rendered[platform]
    assert observed(docs) == EXPECTED[platform]
    # the library path is mounted where the flag says, from the same host path
    plugin = find(docs, "DaemonSet", "-device-plugin")["spec"]["template"]["spec"]
    lib = next(v for v in plugin["volumes"] if v["name"] == "isolation-lib")
    assert lib["hostPath"]["path"] == EXPECTED[platform]["libDir"]
    privileged = EXPECTED[platform]["privileged"]
    security = plugin["containers"][0]["securityContext"]
    assert ("capabilities" in security) is not privileged
    daemonset = (CHART / "templates" / "deviceplugin-daemonset.yaml").read_text()
    if platform == "gke" and "--driver-root=" in daemonset:
        # the driver-root hand-off's flags, from the preset's driverRoot.hostPath
        args = plugin["containers"][0]["args"]
        assert _flag(args, "--driver-root") == "/home/kubernetes/bin/nvidia"


def test_no_preset_changes_what_the_chart_rendered_before(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """platform "" (the default) and the presets that set nothing render the same objects."""
    default = render()
    assert rendered[""] == default
    assert rendered["eks"] == default
    assert rendered["aks"] == default


def test_gke_steers_tolerations_and_sends_pods_naming_gpushare(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    configuration = pytest.importorskip("gpushare.webhook.configuration")
    docs = rendered["gke"]
    chart = find(docs, "MutatingWebhookConfiguration", "-webhook")
    expected = configuration.steering_configuration(
        ca_bundle="",
        service={"namespace": NAMESPACE, "name": f"{RELEASE}-webhook", "port": 443},
        excluded_namespaces=["kube-system", NAMESPACE],
        tolerating="ack-co-scheduler",
    )
    expected["webhooks"][0]["clientConfig"].pop("caBundle")
    assert chart["webhooks"] == expected["webhooks"]
    args = find(docs, "Deployment", "-webhook")["spec"]["template"]["spec"]["containers"][0]
    (flag,) = [a for a in args["args"] if a.startswith("--steer-toleration=")]
    assert parse_toleration(flag.split("=", 1)[1]).as_json() == GKE_TOLERATION
    # without tolerations the condition is what it always was
    plain = find(rendered[""], "MutatingWebhookConfiguration", "-webhook")
    condition = plain["webhooks"][0]["matchConditions"][0]["expression"]
    assert condition.endswith('in ["default-scheduler"]')


OVERRIDES = [
    ("bottlerocket", "devicePlugin.privileged=false", "privileged", False),
    ("gke", "isolation.libHostPath=/opt/gpushare", "libDir", "/opt/gpushare"),
    ("bottlerocket", "devicePlugin.deviceListStrategy=envvar", "deviceListStrategy", "envvar"),
    ("gke", "devicePlugin.kubeletConfigPath=", "kubeletConfig", None),
    ("gke", "priorityClassQuota.enabled=false", "quotaClasses", None),
    ("openshift", "devicePlugin.runtimeClassName=crun", "runtimeClassName", "crun"),
]


@pytest.mark.parametrize(
    ("platform", "setting", "field", "value"), OVERRIDES, ids=[o[1] for o in OVERRIDES]
)
def test_a_value_the_user_sets_wins_over_the_preset(
    platform: str, setting: str, field: str, value: Any
) -> None:
    docs = render("--set", f"platform={platform}", "--set", setting)
    seen = observed(docs)
    assert seen[field] == value
    # and nothing else of the preset moves
    assert {k: v for k, v in seen.items() if k != field} == {
        k: v for k, v in EXPECTED[platform].items() if k != field
    }


def test_empty_maps_and_lists_set_by_the_user_win_too(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "platform": "bottlerocket",
                "devicePlugin": {"seLinuxOptions": {}, "privileged": False},
            }
        )
    )
    seen = observed(render("-f", str(values)))
    assert seen["seLinuxOptions"] is None and seen["privileged"] is False
    assert seen["libDir"] == "/var/lib/gpushare-lib"
    gke = observed(render("--set", "platform=gke", "--set-json", "webhook.steer.tolerations=[]"))
    assert gke["steerTolerations"] == []
    openshift = observed(render("--set", "platform=openshift", "--set", "openshift.enabled=false"))
    assert openshift["fixedUids"] is True and openshift["sccBindings"] == {}
    assert openshift["runtimeClassName"] == "nvidia"
    own = observed(render("--set", "platform=k3s", "--set", "devicePlugin.runtimeClassName=crun"))
    assert own["runtimeClassName"] == "crun"


def test_the_presets_are_the_platforms_the_schema_offers() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["properties"]["platform"]["enum"] == PLATFORMS
    files = {p.stem for p in (CHART / "platforms").glob("*.yaml")}
    assert files == {"generic", *[p for p in PLATFORMS if p]}
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for name in sorted(files):
        preset = yaml.safe_load((CHART / "platforms" / f"{name}.yaml").read_text()) or {}
        for path in preset:
            node: Any = values
            for part in path.split(".")[:-1]:
                node = node.get(part) if isinstance(node, dict) else None
            last = path.rsplit(".", 1)[-1]
            # a preset can only fill a value the user left null
            assert isinstance(node, dict) and last in node, f"{name}.yaml: {path} not in values"
            assert node[last] is None, f"{name}.yaml: {path} must be null in values.yaml"


def test_every_preset_key_is_explained_in_its_file() -> None:
    """Each line a preset sets follows a comment that says why (the issue: every value it sets
    explained)."""
    for preset in sorted((CHART / "platforms").glob("*.yaml")):
        lines = preset.read_text().splitlines()
        for number, line in enumerate(lines):
            if re.match(r"^[A-Za-z]", line) and line != "{}":
                assert lines[number - 1].startswith("#"), f"{preset.name}:{number + 1}: {line}"


def _actions(text: str) -> str:
    return " ".join(re.findall(r"\{\{.*?\}\}", text, re.DOTALL))


def test_every_template_reading_a_preset_key_resolves_the_preset_first() -> None:
    """The presets fill values in place (_helpers.tpl gpushare.platform.resolve); a template that
    read a null one before that would render the wrong thing silently."""
    keys: set[str] = set()
    for preset in (CHART / "platforms").glob("*.yaml"):
        keys |= set(yaml.safe_load(preset.read_text()) or {})
    generic = {"enabled", "tolerations", "hostPath"}
    tokens = set()
    for key in keys:
        parts = key.split(".")
        tokens.add(".".join(parts[-2:]) if parts[-1] in generic else parts[-1])
    pattern = re.compile(r"\.(" + "|".join(re.escape(t) for t in sorted(tokens)) + r")\b")
    for template in sorted((CHART / "templates").rglob("*")):
        if not template.is_file() or template.name == "_helpers.tpl":
            continue
        actions = _actions(template.read_text())
        actions = actions.replace("$d.", ".devicePlugin.").replace("$w.", ".webhook.")
        read = pattern.search(actions)
        if read:
            resolved = actions.find('include "gpushare.platform.resolve"')
            assert 0 <= resolved < read.start(), (
                f"{template.relative_to(CHART)} reads {read.group(0)!r} (a preset key): include "
                f'"gpushare.platform.resolve" before it'
            )


@pytest.mark.parametrize(
    ("setting", "words"),
    [
        ("platform=gcp", "at '/platform': value must be one of '', 'gke'"),
        ("webhook.hostNetwork=yes", "/webhook/hostNetwork"),
        ("webhook.steer.tolerations[0].effect=Never", "/webhook/steer/tolerations/0/effect"),
        ("devicePlugin.seLinuxOptions.kind=x", "/devicePlugin/seLinuxOptions"),
        ("priorityClassQuota.pods=0", "/priorityClassQuota/pods"),
        ("devicePlugin.extraVolumeMounts[0].name=x", "missing property 'mountPath'"),
        ("webhook.extraVolumes[0].hostPath.path=/x", "/webhook/extraVolumes/0"),
        ("podSecurity.check=maybe", "/podSecurity/check"),
        ("openshift.scc.devicePlugin=", "/openshift/scc/devicePlugin"),
        ("devicePlugin.privileged=maybe", "/devicePlugin/privileged"),
    ],
)
def test_the_schema_refuses_naming_the_field(setting: str, words: str) -> None:
    result = helm(*template_args(), "--set", setting, check=False)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert words in result.stderr, result.stderr


def test_extra_volumes_and_mounts_reach_each_component() -> None:
    volume = {"name": "driver", "hostPath": {"path": "/opt/driver", "type": "Directory"}}
    mount = {"name": "driver", "mountPath": "/opt/driver", "readOnly": True}
    args = []
    for component in ("devicePlugin", "scheduler", "webhook"):
        args += ["--set-json", f"{component}.extraVolumes=[{json.dumps(volume)}]"]
        args += ["--set-json", f"{component}.extraVolumeMounts=[{json.dumps(mount)}]"]
    docs = render(*args)
    specs = {
        "device-plugin": find(docs, "DaemonSet", "-device-plugin")["spec"]["template"]["spec"],
        "extender": find(docs, "Deployment", "-scheduler")["spec"]["template"]["spec"],
        "webhook": find(docs, "Deployment", "-webhook")["spec"]["template"]["spec"],
    }
    for container_name, spec in specs.items():
        assert volume in spec["volumes"], container_name
        (container,) = [c for c in spec["containers"] if c["name"] == container_name]
        assert mount in container["volumeMounts"], container_name


def test_webhook_host_network_keeps_the_port_and_the_service_follows() -> None:
    docs = render("--set", "webhook.hostNetwork=true", "--set", "webhook.port=10260")
    spec = find(docs, "Deployment", "-webhook")["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    (container,) = spec["containers"]
    assert "--port=10260" in container["args"]
    (port,) = container["ports"]
    assert port == {"name": "https", "containerPort": 10260, "protocol": "TCP"}
    service = find(docs, "Service", "-webhook")
    assert service["spec"]["ports"][0]["targetPort"] == "https"
    default = find(render(), "Deployment", "-webhook")["spec"]["template"]["spec"]
    assert "hostNetwork" not in default and "dnsPolicy" not in default
    # under OpenShift the webhook's ServiceAccount is bound to hostnetwork-v2 instead
    openshift = observed(render("--set", "platform=openshift", "--set", "webhook.hostNetwork=true"))
    assert openshift["sccBindings"][f"{RELEASE}-webhook"] == "hostnetwork-v2"


def test_the_quota_scopes_the_classes_of_the_enabled_components() -> None:
    docs = render(
        "--set", "priorityClassQuota.enabled=true", "--set", "devicePlugin.enabled=false",
        "--set", "priorityClassQuota.pods=250",
    )  # fmt: skip
    quota = find(docs, "ResourceQuota", "-critical-pods")
    assert quota["metadata"]["namespace"] == NAMESPACE
    assert quota["spec"]["hard"] == {"pods": "250"}
    values = quota["spec"]["scopeSelector"]["matchExpressions"][0]["values"]
    assert values == ["system-cluster-critical"]


def test_pod_security_namespace_for_gitops_and_no_check_without_a_cluster() -> None:
    """``helm template`` has no cluster: the check (a lookup) passes, whatever the namespace;
    tests/e2e/test_chart_podsecurity.py shows the refusal against a real API server."""
    assert not [d for d in render() if d["kind"] == "Namespace"]
    docs = render("--set", "podSecurity.createNamespace=true")
    namespace = find(docs, "Namespace", NAMESPACE)
    labels = namespace["metadata"]["labels"]
    for mode in ("enforce", "audit", "warn"):
        assert labels[f"pod-security.kubernetes.io/{mode}"] == "privileged"


def test_the_notes_name_the_preset_and_the_namespace_label(tmp_path: Path) -> None:
    notes = render_notes(tmp_path, "--set", "platform=gke")
    assert "Platform preset: gke" in notes
    assert (
        f"kubectl label namespace {NAMESPACE} pod-security.kubernetes.io/enforce=privileged"
        in notes
    )
    assert "Platform preset: none (generic)" in render_notes(tmp_path / "generic")
