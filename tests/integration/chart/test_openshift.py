"""The chart's pods against OpenShift's SecurityContextConstraints, written here as data.

No OpenShift API server runs here, so SCC admission itself is the vendor's word; what is tested
is the chart's side of it: under ``platform: openshift`` every pod fits the rules of the SCC its
ServiceAccount is bound to (templates/openshift-scc.yaml), and the chart without it does not
(../shared/docs/PLATFORMS.md O1, O2: fixed uids refused by restricted-v2, the device plugin
only under privileged).

The rules are those of OpenShift 4's default SCCs as the cluster-kube-apiserver-operator ships
them (github.com/openshift/cluster-kube-apiserver-operator,
bindata/bootkube/scc-manifests/0000_20_kube-apiserver-operator_00_scc-{restricted-v2,
nonroot-v2,hostnetwork-v2,privileged}.yaml), reduced to the fields a pod spec can break. A
strategy's admission behaviour, from OpenShift's "Managing security context constraints":
MustRunAsRange assigns a uid from the namespace's range and refuses a fixed one outside it (a
namespace's range starts near 1000000000, so the chart's 65532 and 0 are always outside);
MustRunAs for fsGroup likewise; MustRunAsNonRoot refuses uid 0; RunAsAny takes anything. An
unset allowPrivilegeEscalation or seccomp profile is defaulted by the SCC, a set one must be
allowed; requiredDropCapabilities are added by the SCC, so only added capabilities can break it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pytest

from tests.support.chart import RELEASE, needs_helm, render

pytestmark = needs_helm


@dataclass(frozen=True)
class Scc:
    """The parts of a SecurityContextConstraints a pod spec can fail."""

    name: str
    host_network: bool
    host_ports: bool
    host_pid: bool
    host_ipc: bool
    host_dir_volumes: bool
    privileged: bool
    privilege_escalation: bool
    allowed_capabilities: tuple[str, ...]
    run_as_user: str
    fs_group: str
    se_linux: str
    seccomp: tuple[str, ...]
    volumes: tuple[str, ...]


_V2_VOLUMES = (
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
    "projected", "secret",
)  # fmt: skip

RESTRICTED_V2 = Scc(
    name="restricted-v2",
    host_network=False,
    host_ports=False,
    host_pid=False,
    host_ipc=False,
    host_dir_volumes=False,
    privileged=False,
    privilege_escalation=False,
    allowed_capabilities=("NET_BIND_SERVICE",),
    run_as_user="MustRunAsRange",
    fs_group="MustRunAs",
    se_linux="MustRunAs",
    seccomp=("runtime/default",),
    volumes=(*_V2_VOLUMES, "image"),
)
# the other v2 SCCs differ from restricted-v2 only where named
NONROOT_V2 = replace(
    RESTRICTED_V2,
    name="nonroot-v2",
    run_as_user="MustRunAsNonRoot",
    fs_group="RunAsAny",
    volumes=_V2_VOLUMES,
)
HOSTNETWORK_V2 = replace(
    RESTRICTED_V2, name="hostnetwork-v2", host_network=True, host_ports=True, volumes=_V2_VOLUMES
)
PRIVILEGED = Scc(
    name="privileged",
    host_network=True,
    host_ports=True,
    host_pid=True,
    host_ipc=True,
    host_dir_volumes=True,
    privileged=True,
    privilege_escalation=True,
    allowed_capabilities=("*",),
    run_as_user="RunAsAny",
    fs_group="RunAsAny",
    se_linux="RunAsAny",
    seccomp=("*",),
    volumes=("*",),
)
SCCS = {scc.name: scc for scc in (RESTRICTED_V2, NONROOT_V2, HOSTNETWORK_V2, PRIVILEGED)}

_SECCOMP = {"RuntimeDefault": "runtime/default", "Unconfined": "unconfined"}


def violations(spec: dict[str, Any], scc: Scc) -> list[str]:
    """What in the pod spec ``scc`` refuses, in words (empty: admitted)."""
    found: list[str] = []
    for field, allowed in (
        ("hostNetwork", scc.host_network),
        ("hostPID", scc.host_pid),
        ("hostIPC", scc.host_ipc),
    ):
        if spec.get(field) and not allowed:
            found.append(f"{field}: true")
    containers = [*spec.get("initContainers", []), *spec["containers"]]
    host_ports = spec.get("hostNetwork") or any(
        p.get("hostPort") for c in containers for p in c.get("ports", [])
    )
    if host_ports and not scc.host_ports:
        found.append("host ports")
    for volume in spec.get("volumes", []):
        kind = next(k for k in volume if k != "name")
        if kind == "hostPath" and not scc.host_dir_volumes:
            found.append(f"volume {volume['name']}: hostPath")
        elif "*" not in scc.volumes and kind not in scc.volumes and kind != "hostPath":
            found.append(f"volume {volume['name']}: {kind}")
    pod_context = spec.get("securityContext") or {}
    contexts = [(f"container {c['name']}", c.get("securityContext") or {}) for c in containers]
    for where, context in [("pod", pod_context), *contexts]:
        user = context.get("runAsUser")
        if user is not None and scc.run_as_user == "MustRunAsRange":
            found.append(f"{where}: runAsUser {user} is outside the namespace's range")
        if user == 0 and scc.run_as_user == "MustRunAsNonRoot":
            found.append(f"{where}: runAsUser 0")
        options = context.get("seLinuxOptions")
        if options and scc.se_linux == "MustRunAs":
            found.append(f"{where}: seLinuxOptions {options} are not the namespace's")
        profile = (context.get("seccompProfile") or {}).get("type")
        allowed = "*" in scc.seccomp or _SECCOMP.get(profile or "", "") in scc.seccomp
        if profile and not allowed:
            found.append(f"{where}: seccompProfile {profile}")
    group = pod_context.get("fsGroup")
    if group is not None and scc.fs_group == "MustRunAs":
        found.append(f"pod: fsGroup {group} is outside the namespace's range")
    for where, context in contexts:
        if context.get("privileged") and not scc.privileged:
            found.append(f"{where}: privileged")
        if context.get("allowPrivilegeEscalation") and not scc.privilege_escalation:
            found.append(f"{where}: allowPrivilegeEscalation")
        added = (context.get("capabilities") or {}).get("add") or []
        for capability in added:
            if "*" not in scc.allowed_capabilities and capability not in scc.allowed_capabilities:
                found.append(f"{where}: capability {capability}")
    return found


def pods(docs: list[dict[str, Any]]) -> dict[str, tuple[str, dict[str, Any]]]:
    """Every pod the chart makes: name -> (its ServiceAccount, its spec)."""
    out = {}
    for doc in docs:
        if doc["kind"] == "Pod":
            spec = doc["spec"]
        elif doc["kind"] in {"Deployment", "DaemonSet", "Job"}:
            spec = doc["spec"]["template"]["spec"]
        else:
            continue
        out[doc["metadata"]["name"]] = (spec.get("serviceAccountName", "default"), spec)
    return out


def granted(docs: list[dict[str, Any]]) -> dict[str, str]:
    """ServiceAccount -> the SCC a RoleBinding of the chart lets it use."""
    roles = {
        d["metadata"]["name"]: d["rules"][0]
        for d in docs
        if d["kind"] == "ClusterRole"
        and d["rules"][0].get("resources") == ["securitycontextconstraints"]
    }
    for rule in roles.values():
        assert rule["apiGroups"] == ["security.openshift.io"] and rule["verbs"] == ["use"]
    return {
        d["subjects"][0]["name"]: roles[d["roleRef"]["name"]]["resourceNames"][0]
        for d in docs
        if d["kind"] == "RoleBinding" and d["roleRef"]["name"] in roles
    }


@pytest.mark.parametrize(
    "extra",
    [[], ["--set", "webhook.hostNetwork=true"], ["--set", "devicePlugin.privileged=false"]],
    ids=["preset", "webhook-host-network", "unprivileged-plugin"],
)
def test_under_openshift_every_pod_fits_the_scc_its_account_may_use(extra: list[str]) -> None:
    docs = render("--set", "platform=openshift", *extra)
    sccs = granted(docs)
    for name, (account, spec) in pods(docs).items():
        # the helm-test pod runs as the namespace's default account, which every
        # authenticated user's restricted-v2 covers (system:authenticated)
        scc = SCCS[sccs.get(account, "restricted-v2")]
        assert violations(spec, scc) == [], f"{name} ({account}) under {scc.name}"
    assert sccs[f"{RELEASE}-device-plugin"] == "privileged"


def test_without_openshift_the_chart_fails_restricted_v2_as_users_saw() -> None:
    """The failure before the change (PLATFORMS.md O1): fixed uids and fsGroup 65532."""
    docs = render()
    assert granted(docs) == {}
    found = {name: violations(spec, RESTRICTED_V2) for name, (_, spec) in pods(docs).items()}
    assert "pod: runAsUser 65532 is outside the namespace's range" in found[f"{RELEASE}-scheduler"]
    assert "pod: fsGroup 65532 is outside the namespace's range" in found[f"{RELEASE}-scheduler"]
    assert "pod: runAsUser 65532 is outside the namespace's range" in found[f"{RELEASE}-webhook"]
    plugin = found[f"{RELEASE}-device-plugin"]
    assert "hostPID: true" in plugin and "volume state: hostPath" in plugin


def test_the_rules_are_not_vacuous() -> None:
    """Each SCC refuses what it should: the checks above could not pass by accident."""
    spec = {
        "hostNetwork": True,
        "securityContext": {"runAsUser": 0, "fsGroup": 1},
        "containers": [
            {
                "name": "c",
                "securityContext": {
                    "privileged": True,
                    "capabilities": {"add": ["SYS_ADMIN"]},
                    "seccompProfile": {"type": "Unconfined"},
                    "seLinuxOptions": {"type": "super_t"},
                },
            }
        ],
        "volumes": [{"name": "h", "hostPath": {"path": "/"}}],
    }
    assert violations(spec, PRIVILEGED) == []
    assert len(violations(spec, RESTRICTED_V2)) == 9  # every field above
    assert "pod: runAsUser 0" in violations(spec, NONROOT_V2)
    assert "hostNetwork: true" not in violations(spec, HOSTNETWORK_V2)
