"""The Helm chart: ``helm lint``, ``helm template`` and what it renders.

The helm binary is the one ``harness/controlplane/build.sh`` builds into its cache (``make
controlplane``); without it these tests skip and say so. The chart's KubeSchedulerConfiguration
must equal ``gpushare.schedconfig.scheduler_configuration`` for the same values (the e2e
tests run kube-scheduler with that function's output), its webhook configuration must equal
``gpushare.webhook.configuration.webhook_configuration``, and every flag it passes to a
``gpushare`` subcommand must exist.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from gpushare.cli import main as cli
from gpushare.cli.logs import LEVELS
from gpushare.core.admitting.tampering import DEFAULT_EXEMPT_NAMESPACES, VISIBLE_DEVICES_MODES
from gpushare.core.model.inventory import SHARED_MODES
from gpushare.core.model.names import ResourceNames
from gpushare.core.model.startuptaint import STARTUP_TAINT
from gpushare.schedconfig import scheduler_configuration
from harness.image_archive import project_version, recipe_repository
from tests.support.chart import (
    BUILD_SH,
    CHART,
    CI_VALUES,
    GPUSHARE_IMAGE,
    KUBE_VERSION,
    NAMESPACE,
    RELEASE,
    REPO,
    cached,
    find,
    find_job,
    helm,
    needs_helm,
    render,
    render_notes,
    template_args,
)

pytestmark = needs_helm


def containers(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    found = []
    for doc in docs:
        spec = doc.get("spec", {}).get("template", {}).get("spec", {})
        found.extend(spec.get("containers", []))
    return found


@pytest.fixture(scope="module")
def default_docs() -> list[dict[str, Any]]:
    return render()


@pytest.fixture(scope="module")
def ci_docs() -> list[dict[str, Any]]:
    return render("-f", str(CI_VALUES))


@pytest.mark.parametrize(
    "values",
    [None, *sorted(CHART.glob("ci/*.yaml"))],
    ids=lambda v: v.name if v else "default",
)
def test_helm_lint(values: Path | None) -> None:
    args = ["lint", "--strict", str(CHART), "--namespace", NAMESPACE]
    args += ["--kube-version", KUBE_VERSION]
    if values:
        args += ["-f", str(values)]
    result = helm(*args)
    assert "0 chart(s) failed" in result.stdout


def test_default_objects(default_docs: list[dict[str, Any]]) -> None:
    kinds = {d["kind"] for d in default_docs}
    assert {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ConfigMap",
        "Deployment",
        "DaemonSet",
        "Service",
        "Job",
        "PodDisruptionBudget",
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    } <= kinds
    assert "Certificate" not in kinds
    for doc in default_docs:
        if doc["kind"] not in {
            "ClusterRole",
            "ClusterRoleBinding",
            "ValidatingWebhookConfiguration",
            "MutatingWebhookConfiguration",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        }:
            assert doc["metadata"].get("namespace") in (NAMESPACE, "kube-system"), doc["kind"]


def scheduler_config(docs: list[dict[str, Any]]) -> dict[str, Any]:
    data = find(docs, "ConfigMap", "-scheduler")["data"]["scheduler-config.yaml"]
    config: dict[str, Any] = yaml.safe_load(data)
    return config


def test_scheduler_config_equals_schedconfig(default_docs: list[dict[str, Any]]) -> None:
    assert scheduler_config(default_docs) == scheduler_configuration(
        url="http://127.0.0.1:32766",
        kubeconfig=None,
        leader_elect=True,
        default_profile=False,
        lease=(NAMESPACE, f"{RELEASE}-scheduler"),
    )


def test_scheduler_config_follows_values(ci_docs: list[dict[str, Any]]) -> None:
    names = ResourceNames(
        mem="example.com/gpu-mem",
        core="example.com/gpu-core.percentage",
        count="example.com/gpu-count",
    )
    assert scheduler_config(ci_docs) == scheduler_configuration(
        url="http://127.0.0.1:32766",
        kubeconfig=None,
        leader_elect=True,
        names=names,
        default_profile=True,
        lease=(NAMESPACE, f"{RELEASE}-scheduler"),
    )
    other = render(
        "--set",
        "scheduler.schedulerName=gpu-share",
        "--set",
        "scheduler.httpTimeout=10s",
        "--set",
        "scheduler.percentageOfNodesToScore=20",
    )
    assert scheduler_config(other) == scheduler_configuration(
        url="http://127.0.0.1:32766",
        kubeconfig=None,
        default_profile=False,
        scheduler_name="gpu-share",
        http_timeout="10s",
        lease=(NAMESPACE, f"{RELEASE}-scheduler"),
        percentage=20,
    )


def oldest_release() -> str:
    """The oldest supported release build.sh pins (``kubernetes-1.<minor>/go.mod``)."""
    (go_mod,) = BUILD_SH.parent.glob("kubernetes-1.*/go.mod")
    found = re.search(r"^require k8s\.io/kubernetes (v\S+)$", go_mod.read_text(), re.MULTILINE)
    assert found, f"{go_mod} requires no k8s.io/kubernetes release"
    return found.group(1)


OLDEST_VERSION = oldest_release()
# A kubeconfig the configuration must name (the pod's in-cluster connection does not exist
# here); kube-scheduler only builds a client from it, and connects to nothing.
NOWHERE = """apiVersion: v1
kind: Config
clusters: [{name: nowhere, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: nobody, user: {token: unused}}]
contexts: [{name: nowhere, context: {cluster: nowhere, user: nobody}}]
current-context: nowhere
"""


@pytest.mark.parametrize("release", [KUBE_VERSION, OLDEST_VERSION])
@pytest.mark.parametrize("values", [None, CI_VALUES], ids=["default", "ci-values"])
def test_kube_scheduler_accepts_the_chart(
    values: Path | None, release: str, tmp_path: Path
) -> None:
    """kube-scheduler validates the ConfigMap (leader election included) and the pod's flags.

    At the newest release and at the oldest the chart supports (the chart runs the cluster's
    own kube-scheduler). ``--write-config-to`` loads, defaults and validates the configuration,
    writes it and exits before scheduling; ``--secure-port=0`` keeps it from listening.
    """
    kube_scheduler = cached(f"kubernetes-{release}", "kube-scheduler")
    if kube_scheduler is None:
        build = (
            "make controlplane" if release == KUBE_VERSION else f"K8S_VERSION={release} {BUILD_SH}"
        )
        pytest.skip(f"kube-scheduler {release} not built: `{build}`")
    docs = render("--kube-version", release, *(["-f", str(values)] if values else []))
    config = scheduler_config(docs)
    (tmp_path / "kubeconfig").write_text(NOWHERE)
    config["clientConnection"] = {"kubeconfig": str(tmp_path / "kubeconfig")}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    pod = find(docs, "Deployment", "-scheduler")["spec"]["template"]["spec"]
    binary, *flags = pod["containers"][0]["command"]
    assert binary == "kube-scheduler"
    flags = [
        f"--config={tmp_path / 'config.yaml'}" if f.startswith("--config=") else f
        for f in flags
        if not f.startswith("--secure-port=")
    ]
    result = subprocess.run(
        [str(kube_scheduler), *flags, "--secure-port=0", f"--write-config-to={tmp_path / 'out'}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    written = yaml.safe_load((tmp_path / "out").read_text())
    assert written["leaderElection"]["resourceName"] == f"{RELEASE}-scheduler"
    assert [p["schedulerName"] for p in written["profiles"]] == [
        p["schedulerName"] for p in config["profiles"]
    ]


@pytest.mark.parametrize(
    ("cluster", "image"),
    [
        ("v1.30.4-eks-a737599", "v1.30.4"),
        ("v1.31.1+k3s1", "v1.31.1"),
        ("v1.32.2-gke.1182003", "v1.32.2"),
    ],
)
def test_kube_scheduler_follows_the_cluster_s_release(cluster: str, image: str) -> None:
    """Within the version-skew policy on every cluster, 1.30 to now; a pin is kept as named."""
    docs = render("--kube-version", cluster)
    scheduler = find(docs, "Deployment", "-scheduler")["spec"]["template"]["spec"]["containers"][0]
    assert scheduler["image"] == f"registry.k8s.io/kube-scheduler:{image}"
    docs = render("--kube-version", cluster, "--set", "scheduler.image.tag=v1.30.0")
    scheduler = find(docs, "Deployment", "-scheduler")["spec"]["template"]["spec"]["containers"][0]
    assert scheduler["image"] == "registry.k8s.io/kube-scheduler:v1.30.0"


@pytest.mark.parametrize(
    ("cluster", "tag", "path"),
    [
        ("v1.30.14", "", "/healthz"),
        ("v1.30.4-eks-a737599", "", "/healthz"),
        ("v1.31.0", "", "/readyz"),
        ("v1.36.3", "", "/readyz"),
        ("v1.36.3", "v1.30.2", "/healthz"),
        ("v1.30.14", "v1.31.1", "/readyz"),
        ("v1.36.3", "custom-build", "/healthz"),
    ],
)
def test_kube_scheduler_readiness_follows_the_release_it_runs(
    cluster: str, tag: str, path: str
) -> None:
    """kube-scheduler serves /readyz from 1.31 only; 1.30 answers 404 there, which left the
    scheduler pod never Ready on the oldest supported release (``make e2e-oldest``). /healthz,
    served by every release, is the fallback for 1.30 and for a tag that names no release."""
    docs = render(
        "--kube-version", cluster, *(["--set", f"scheduler.image.tag={tag}"] if tag else [])
    )
    pod = find(docs, "Deployment", "-scheduler")["spec"]["template"]["spec"]
    scheduler = next(c for c in pod["containers"] if c["name"] == "kube-scheduler")
    assert scheduler["readinessProbe"]["httpGet"]["path"] == path
    assert scheduler["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_scheduler_pod(default_docs: list[dict[str, Any]]) -> None:
    deployment = find(default_docs, "Deployment", "-scheduler")
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    scheduler, extender = pod["containers"]
    # the cluster's own release (rendered for the pinned control plane)
    assert scheduler["image"] == f"registry.k8s.io/kube-scheduler:{KUBE_VERSION}"
    assert "--config=/etc/gpushare/scheduler-config.yaml" in scheduler["command"]
    assert scheduler["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert extender["args"][:3] == ["extender", "--host=127.0.0.1", "--port=32766"]
    assert "--gpu-memory-unit=1GiB" in extender["args"]
    assert "readinessProbe" in extender and "livenessProbe" in extender


def test_device_plugin_daemonset(default_docs: list[dict[str, Any]]) -> None:
    daemonset = find(default_docs, "DaemonSet", "-device-plugin")
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-node-critical"
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    expression = terms["nodeSelectorTerms"][0]["matchExpressions"][0]
    assert expression == {
        "key": "ack.node.gpu.schedule",
        "operator": "In",
        "values": ["share", "cgpu", "core_mem", "mps"],
    }
    assert {t["key"] for t in pod["tolerations"]} == {
        "nvidia.com/gpu",
        "CriticalAddonsOnly",
        STARTUP_TAINT,
    }
    (container,) = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    # not privileged: root for the root-owned hostPaths, nothing else; NVML's devices and library
    # come from the NVIDIA container runtime
    assert container["securityContext"] == {
        "runAsUser": 0,
        "runAsNonRoot": False,
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "compute,utility"
    assert pod["automountServiceAccountToken"] is True and "runtimeClassName" not in pod
    # kept for MPS mode until it is tried without it on a real node (the chart says why)
    assert pod["hostPID"] is True
    paths = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert {
        "/var/lib/kubelet/device-plugins",
        "/var/lib/kubelet/pod-resources",
        "/var/lib/gpushare",
        "/usr/local/gpushare",
    } <= paths
    # the plugin hands kubelet host paths, so it sees them at the same paths
    mounted = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/var/lib/gpushare", "/usr/local/gpushare"} <= mounted
    args = container["args"]
    assert "--state-dir=/var/lib/gpushare" in args and "--isolation=auto" in args
    assert "--isolation-lib-dir=/usr/local/gpushare" in args
    # the accounting broker's caps (docs/device-plugin.md), as the command's defaults
    assert "--broker-max-connections-per-pod=2048" in args
    assert "--broker-max-connections-per-node=16384" in args
    assert "--broker-min-connections-per-container=16" in args
    assert "--broker-idle-timeout=60" in args


def test_device_plugin_needs_no_kubelet_file_unless_one_is_named(
    default_docs: list[dict[str, Any]],
) -> None:
    """EKS, GKE, k3s and RKE2 have no /var/lib/kubelet/config.yaml: a File hostPath there kept
    the pod in ContainerCreating. kubelet's policy comes through PodResources instead."""
    pod = find(default_docs, "DaemonSet", "-device-plugin")["spec"]["template"]["spec"]
    assert not [v for v in pod["volumes"] if v.get("hostPath", {}).get("type") == "File"]
    args = pod["containers"][0]["args"]
    assert "--kubelet-config=/nonexistent" in args and "--cpu-manager-state=/nonexistent" in args
    docs = render("--set", "devicePlugin.kubeletConfigPath=/etc/kubernetes/kubelet/config.json")
    pod = find(docs, "DaemonSet", "-device-plugin")["spec"]["template"]["spec"]
    files = [v["hostPath"] for v in pod["volumes"] if v.get("hostPath", {}).get("type") == "File"]
    assert files == [{"path": "/etc/kubernetes/kubelet/config.json", "type": "File"}]


def test_device_plugin_hands_gpus_over_by_cdi_unless_told_envvar(
    default_docs: list[dict[str, Any]],
) -> None:
    """cdi-cri by default, the node's CDI spec directories mounted read-only to check them."""
    pod = find(default_docs, "DaemonSet", "-device-plugin")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = container["args"]
    assert "--device-list-strategy=cdi-cri" in args and "--cdi-kind=nvidia.com/gpu" in args
    assert "--cdi-spec-dirs=/host/cdi/0,/host/cdi/1" in args
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/host/cdi/0"]["readOnly"] is True and mounts["/host/cdi/1"]["readOnly"] is True
    volumes = {v["name"]: v["hostPath"] for v in pod["volumes"] if "hostPath" in v}
    assert volumes[mounts["/host/cdi/0"]["name"]] == {
        "path": "/etc/cdi",
        "type": "DirectoryOrCreate",
    }
    assert volumes[mounts["/host/cdi/1"]["name"]]["path"] == "/var/run/cdi"
    docs = render("--set", "devicePlugin.deviceListStrategy=envvar")
    pod = find(docs, "DaemonSet", "-device-plugin")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert "--device-list-strategy=envvar" in container["args"]
    assert not [a for a in container["args"] if a.startswith("--cdi")]
    assert not [v for v in pod["volumes"] if v["name"].startswith("cdi")]


def test_driver_root_mounts_the_driver_and_passes_its_flags() -> None:
    """GKE's layout (docs/driver-root.md): the driver at the same path, read-only; privileged,
    as NVML opens the host's device nodes without a runtime to grant them; no CDI mounts."""
    docs = render(
        "--set",
        "devicePlugin.deviceListStrategy=driver-root",
        "--set",
        "devicePlugin.driverRoot.hostPath=/home/kubernetes/bin/nvidia",
    )
    pod = find(docs, "DaemonSet", "-device-plugin")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = container["args"]
    assert [a for a in args if a.startswith(("--driver-root", "--dev-root"))] == [
        "--driver-root=/home/kubernetes/bin/nvidia",
        "--driver-root-container-path=/usr/local/nvidia",
        "--dev-root=/dev",
    ]
    assert not [a for a in args if a.startswith("--cdi")]
    assert container["securityContext"]["privileged"] is True
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["driver-root"] == {
        "name": "driver-root",
        "mountPath": "/home/kubernetes/bin/nvidia",
        "readOnly": True,
    }
    assert "dev-root" not in mounts  # a privileged container's /dev is the host's
    volumes = {v["name"]: v.get("hostPath") for v in pod["volumes"]}
    assert volumes["driver-root"] == {"path": "/home/kubernetes/bin/nvidia", "type": "Directory"}
    webhook = find(docs, "Deployment", "-webhook")["spec"]["template"]["spec"]["containers"][0]
    assert "--device-list-strategy=driver-root" in webhook["args"]
    docs = render(
        "--set",
        "devicePlugin.deviceListStrategy=driver-root",
        "--set",
        "devicePlugin.driverRoot.hostPath=/opt/nvidia",
        "--set",
        "devicePlugin.driverRoot.devHostPath=/run/fake-dev",
    )
    pod = find(docs, "DaemonSet", "-device-plugin")["spec"]["template"]["spec"]
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["dev-root"]["mountPath"] == "/run/fake-dev" and mounts["dev-root"]["readOnly"]


def test_driver_root_without_the_driver_s_directory_is_refused_naming_the_field() -> None:
    done = helm(
        *template_args(), "--set", "devicePlugin.deviceListStrategy=driver-root", check=False
    )
    # hostPath defaults to null (the platform preset fills it), so the template's own refusal
    # names the field; an explicit "" is the schema's to refuse
    assert done.returncode != 0
    assert "driver-root needs devicePlugin.driverRoot.hostPath" in done.stderr
    done = helm(
        *template_args(),
        "--set",
        "devicePlugin.deviceListStrategy=driver-root",
        "--set",
        "devicePlugin.driverRoot.hostPath=",
        check=False,
    )
    assert done.returncode != 0
    assert "at '/devicePlugin/driverRoot/hostPath': minLength: got 0, want 1" in done.stderr


def test_device_plugin_can_be_privileged_again_and_name_the_nvidia_runtime() -> None:
    docs = render(
        "--set", "devicePlugin.privileged=true", "--set", "devicePlugin.runtimeClassName=nvidia"
    )
    pod = find(docs, "DaemonSet", "-device-plugin")["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["containers"][0]["securityContext"] == {
        "runAsUser": 0,
        "runAsNonRoot": False,
        "privileged": True,
    }


def plugin_policy_docs(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        copy.deepcopy(find(docs, kind, f"-device-plugin-{what}"))
        for what in ("nodes", "pods")
        for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
    ]


def test_device_plugin_policies_equal_the_renderer(
    default_docs: list[dict[str, Any]], ci_docs: list[dict[str, Any]]
) -> None:
    """The chart's CEL is webhook/noderestriction.py's, character for character."""
    from gpushare.webhook.noderestriction import device_plugin_policies

    plugin = f"system:serviceaccount:{NAMESPACE}:{RELEASE}-device-plugin"
    for docs, count, taint in (
        (default_docs, "aliyun.com/gpu-count", STARTUP_TAINT),
        (ci_docs, "example.com/gpu-count", STARTUP_TAINT),
        (render("--set", "devicePlugin.startupTaint="), "aliyun.com/gpu-count", ""),
        (render("--set", "devicePlugin.startupTaint=ready"), "aliyun.com/gpu-count", "ready"),
    ):
        chart = plugin_policy_docs(docs)
        expected = device_plugin_policies(
            service_account=plugin,
            count_resource=count,
            name=f"{RELEASE}-device-plugin",
            startup_taint=taint,
        )
        assert [d["metadata"]["name"] for d in chart] == [d["metadata"]["name"] for d in expected]
        for document in (*chart, *expected):
            document.pop("metadata")
        assert chart == expected
    for setting in ("devicePlugin.nodeRestriction.enabled=false", "devicePlugin.enabled=false"):
        docs = render("--set", setting)
        assert not [
            d for d in docs if d["metadata"]["name"].startswith(f"{RELEASE}-device-plugin-")
        ]


def test_the_plugin_tolerates_and_is_told_the_startup_taint_it_removes(
    default_docs: list[dict[str, Any]],
) -> None:
    """Any effect is tolerated: the pool chooses it (docs/device-plugin.md, "Autoscaled
    pools"); without a key, no toleration and no removal."""

    def plugin(docs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
        pod = find(docs, "DaemonSet", "-device-plugin")["spec"]["template"]["spec"]
        return pod.get("tolerations", []), pod["containers"][0]["args"]

    tolerations, args = plugin(default_docs)
    assert {"key": STARTUP_TAINT, "operator": "Exists"} in tolerations
    assert f"--startup-taint={STARTUP_TAINT}" in args
    tolerations, args = plugin(render("--set", "devicePlugin.startupTaint=example.com/ready"))
    assert {"key": "example.com/ready", "operator": "Exists"} in tolerations
    assert "--startup-taint=example.com/ready" in args
    tolerations, args = plugin(render("--set", "devicePlugin.startupTaint="))
    assert STARTUP_TAINT not in {t["key"] for t in tolerations}
    assert "--startup-taint=" in args
    tolerations, _ = plugin(render("--set", "devicePlugin.tolerations=null"))
    assert tolerations == [{"key": STARTUP_TAINT, "operator": "Exists"}]


def test_the_seal_key_is_made_in_the_cluster_and_mounted_into_extender_and_plugin(
    default_docs: list[dict[str, Any]],
) -> None:
    """No key is rendered (GitOps: the same objects every render); a Job makes the Secret."""
    assert not [
        d for d in default_docs if d["kind"] == "Secret" and "-seal" in d["metadata"]["name"]
    ]
    job = find_job(default_docs, "seal")["spec"]["template"]["spec"]
    (container,) = job["containers"]
    assert container["args"][:2] == ["seal-key", f"--secret={NAMESPACE}/{RELEASE}-seal"]
    role = find(default_docs, "Role", "-seal")
    assert {"get"} == {v for r in role["rules"] if r.get("resourceNames") for v in r["verbs"]}
    assert helm(*template_args()).stdout == helm(*template_args()).stdout
    mine = render("--set", "seal.existingSecret=mine")
    assert not [d for d in mine if d["metadata"]["name"].endswith("-seal")]
    assert not [d for d in mine if d["kind"] == "Job" and "-seal-" in d["metadata"]["name"]]
    for docs, name in ((default_docs, f"{RELEASE}-seal"), (mine, "mine")):
        for kind, suffix, index, mode in (
            ("Deployment", "-scheduler", 1, 0o440),
            ("DaemonSet", "-device-plugin", 0, 0o400),
        ):
            pod = find(docs, kind, suffix)["spec"]["template"]["spec"]
            container = pod["containers"][index]
            assert "--seal-key-file=/var/run/gpushare/seal/key" in container["args"]
            (volume,) = [v for v in pod["volumes"] if v["name"] == "seal"]
            assert volume["secret"] == {"secretName": name, "defaultMode": mode}
            (mount,) = [m for m in container["volumeMounts"] if m["name"] == "seal"]
            assert mount["mountPath"] == "/var/run/gpushare/seal" and mount["readOnly"]


def webhook_config(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return find(docs, "ValidatingWebhookConfiguration", "-webhook")


TRUSTED = [
    f"system:serviceaccount:{NAMESPACE}:{RELEASE}-scheduler",
    f"system:serviceaccount:{NAMESPACE}:{RELEASE}-device-plugin",
]


def comparable(document: dict[str, Any]) -> dict[str, Any]:
    """A webhook configuration without what differs by install: its metadata and CA bundle."""
    document = copy.deepcopy(document)
    document.pop("metadata")
    for webhook in document["webhooks"]:
        webhook["clientConfig"].pop("caBundle", None)
    return document


def test_webhook_config_equals_renderer(
    default_docs: list[dict[str, Any]], ci_docs: list[dict[str, Any]]
) -> None:
    configuration = pytest.importorskip("gpushare.webhook.configuration")
    ci_values = yaml.safe_load(CI_VALUES.read_text())["resourceNames"]
    ci_names = ResourceNames(mem=ci_values["mem"], core=ci_values["core"])
    for docs, names in ((default_docs, ResourceNames()), (ci_docs, ci_names)):
        chart = webhook_config(docs)
        expected = configuration.webhook_configuration(
            ca_bundle="",
            service={"namespace": NAMESPACE, "name": f"{RELEASE}-webhook", "port": 443},
            failure_policy="Fail",
            excluded_namespaces=["kube-system", NAMESPACE],
            trusted_users=TRUSTED,
            names=names,
            # auto beside cdi-cri (the defaults) refuses it from unprivileged containers: pods
            # setting it are sent
            nvidia_visible_devices=True,
            nvidia_visible_devices_exempt=[NAMESPACE, *DEFAULT_EXEMPT_NAMESPACES],
        )
        assert comparable(chart) == comparable(expected)
    # where the rule refuses (auto beside envvar, or refuse), pods setting it are sent too
    for values in (
        ("--set", "devicePlugin.deviceListStrategy=envvar"),
        ("--set", "webhook.nvidiaVisibleDevices=refuse"),
    ):
        chart = webhook_config(render(*values))
        expected = configuration.webhook_configuration(
            ca_bundle="",
            service={"namespace": NAMESPACE, "name": f"{RELEASE}-webhook", "port": 443},
            failure_policy="Fail",
            excluded_namespaces=["kube-system", NAMESPACE],
            trusted_users=TRUSTED,
            nvidia_visible_devices=True,
            nvidia_visible_devices_exempt=[NAMESPACE, *DEFAULT_EXEMPT_NAMESPACES],
        )
        assert comparable(chart) == comparable(expected), values


def test_steering_config_equals_renderer(
    default_docs: list[dict[str, Any]], ci_docs: list[dict[str, Any]]
) -> None:
    configuration = pytest.importorskip("gpushare.webhook.configuration")
    ci_values = yaml.safe_load(CI_VALUES.read_text())["resourceNames"]
    ci_names = ResourceNames(mem=ci_values["mem"], core=ci_values["core"])
    for docs, names in ((default_docs, ResourceNames()), (ci_docs, ci_names)):
        chart = find(docs, "MutatingWebhookConfiguration", "-webhook")
        expected = configuration.steering_configuration(
            ca_bundle="",
            service={"namespace": NAMESPACE, "name": f"{RELEASE}-webhook", "port": 443},
            failure_policy="Fail",
            excluded_namespaces=["kube-system", NAMESPACE],
            names=names,
        )
        assert comparable(chart) == comparable(expected)
    args = find(default_docs, "Deployment", "-webhook")["spec"]["template"]["spec"]
    flags = args["containers"][0]["args"]
    assert "--scheduler-name=ack-co-scheduler" in flags
    assert "--steer-from=default-scheduler" in flags and "--no-steer" not in flags
    certs = find_job(default_docs, "webhook-certs")["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in certs["containers"][0]["env"]}
    assert env["WEBHOOK_KINDS"] == "validatingwebhookconfiguration mutatingwebhookconfiguration"


@pytest.mark.parametrize(("default_mode", "steer"), [("device-plugin", True), ("dra", False)])
def test_dra_webhooks_equal_the_renderer(default_mode: str, steer: bool) -> None:
    """The chart's DRA webhooks are what ``gpushare webhook-config --dra`` prints: in front of
    steering, one for namespaces labelled for DRA mode and one for the rest."""
    configuration = pytest.importorskip("gpushare.webhook.configuration")
    docs = render(
        "--set", "dra.enabled=true", "--set", f"dra.defaultMode={default_mode}",
        "--set", f"webhook.steer.enabled={str(steer).lower()}",
    )  # fmt: skip
    chart = find(docs, "MutatingWebhookConfiguration", "-webhook")
    common: dict[str, Any] = {
        "ca_bundle": "",
        "service": {"namespace": NAMESPACE, "name": f"{RELEASE}-webhook", "port": 443},
        "failure_policy": "Fail",
        "excluded_namespaces": ["kube-system", NAMESPACE],
    }
    webhooks = configuration.dra_webhooks(default_mode=default_mode, **common)
    if steer:
        webhooks += configuration.steering_configuration(**common)["webhooks"]
    expected = configuration.mutating_configuration(webhooks)
    assert comparable(chart) == comparable(expected)
    assert [w["name"] for w in chart["webhooks"]][:2] == [
        "dra-namespace.gpushare.io",
        "dra.gpushare.io",
    ]


def test_steering_can_be_turned_off_or_renamed() -> None:
    docs = render("--set", "webhook.steer.enabled=false")
    assert not [d for d in docs if d["kind"] == "MutatingWebhookConfiguration"]
    flags = find(docs, "Deployment", "-webhook")["spec"]["template"]["spec"]["containers"][0]
    assert "--no-steer" in flags["args"]
    assert not [a for a in flags["args"] if a.startswith("--steer-from")]
    certs = find_job(docs, "webhook-certs")["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in certs["containers"][0]["env"]}
    assert env["WEBHOOK_KINDS"] == "validatingwebhookconfiguration"
    configuration = pytest.importorskip("gpushare.webhook.configuration")
    names = ResourceNames(mem="example.com/gpu-mem", core="example.com/gpu-core")
    docs = render(
        "--set",
        "webhook.steer.fromSchedulerNames={default-scheduler,legacy}",
        "--set",
        "webhook.steer.failurePolicy=Ignore",
        "--set",
        f"resourceNames.mem={names.mem}",
        "--set",
        f"resourceNames.core={names.core}",
    )
    chart = find(docs, "MutatingWebhookConfiguration", "-webhook")
    expected = configuration.steering_configuration(
        ca_bundle="",
        service={"namespace": NAMESPACE, "name": f"{RELEASE}-webhook", "port": 443},
        failure_policy="Ignore",
        excluded_namespaces=["kube-system", NAMESPACE],
        steer_from=["default-scheduler", "legacy"],
        names=names,
    )
    expected["webhooks"][0]["clientConfig"].pop("caBundle")
    assert chart["webhooks"] == expected["webhooks"]
    bad = helm(*template_args(), "--set", "webhook.steer.fromSchedulerNames=null", check=False)
    assert bad.returncode != 0


def test_webhook_trusts_the_extender_and_the_device_plugin(
    default_docs: list[dict[str, Any]],
) -> None:
    args = find(default_docs, "Deployment", "-webhook")["spec"]["template"]["spec"]
    flags = [a for a in args["containers"][0]["args"] if a.startswith("--trusted-")]
    assert flags == [f"--trusted-user={user}" for user in TRUSTED]
    # the names are the ServiceAccounts the scheduler and the device plugin run as
    scheduler = find(default_docs, "Deployment", "-scheduler")["spec"]["template"]["spec"]
    plugin = find(default_docs, "DaemonSet", "-device-plugin")["spec"]["template"]["spec"]
    assert [scheduler["serviceAccountName"], plugin["serviceAccountName"]] == [
        user.rsplit(":", 1)[1] for user in TRUSTED
    ]
    docs = render(
        "--set",
        "devicePlugin.enabled=false",
        "--set",
        "webhook.trustedUsers[0]=ops",
        "--set",
        "webhook.trustedGroups[0]=gpushare:writers",
    )
    args = find(docs, "Deployment", "-webhook")["spec"]["template"]["spec"]["containers"][0]
    assert [a for a in args["args"] if a.startswith("--trusted-")] == [
        f"--trusted-user={TRUSTED[0]}",
        "--trusted-user=ops",
        "--trusted-group=gpushare:writers",
    ]
    _, condition = webhook_config(docs)["webhooks"][0]["matchConditions"]
    assert condition["expression"] == (
        f'!(request.userInfo.username in ["{TRUSTED[0]}","ops"]) && '
        '!request.userInfo.groups.exists(g, g in ["gpushare:writers"])'
    )


def _visible_devices_flags(docs: list[dict[str, Any]]) -> list[str]:
    args = find(docs, "Deployment", "-webhook")["spec"]["template"]["spec"]["containers"][0]
    wanted = ("--nvidia-visible-devices", "--device-list-strategy")
    return [a for a in args["args"] if a.startswith(wanted)]


def test_webhook_is_told_the_visible_devices_rule_and_its_exempt_namespaces(
    default_docs: list[dict[str, Any]],
) -> None:
    """auto beside the device plugin's strategy; the release namespace always exempt."""
    assert _visible_devices_flags(default_docs) == [
        "--nvidia-visible-devices=auto",
        "--device-list-strategy=cdi-cri",
        f"--nvidia-visible-devices-exempt-namespace={NAMESPACE}",
        "--nvidia-visible-devices-exempt-namespace=kube-system",
        "--nvidia-visible-devices-exempt-namespace=gpu-operator",
        "--nvidia-visible-devices-exempt-namespace=nvidia-gpu-operator",
        "--nvidia-visible-devices-exempt-namespace=nvidia-device-plugin",
    ]
    docs = render(
        "--set",
        "webhook.nvidiaVisibleDevices=refuse",
        "--set",
        "devicePlugin.deviceListStrategy=envvar",
        "--set",
        f"webhook.nvidiaVisibleDevicesExemptNamespaces={{{NAMESPACE},nvidia}}",
    )
    assert _visible_devices_flags(docs) == [
        "--nvidia-visible-devices=refuse",
        "--device-list-strategy=envvar",
        f"--nvidia-visible-devices-exempt-namespace={NAMESPACE}",
        "--nvidia-visible-devices-exempt-namespace=nvidia",
    ]


def policy_docs(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        copy.deepcopy(find(docs, "ValidatingAdmissionPolicy", "-handoff")),
        copy.deepcopy(find(docs, "ValidatingAdmissionPolicyBinding", "-handoff")),
    ]


def test_policy_equals_renderer(
    default_docs: list[dict[str, Any]], ci_docs: list[dict[str, Any]]
) -> None:
    """The chart's CEL is the renderer's, character for character, for both value sets."""
    policy = pytest.importorskip("gpushare.webhook.policy")
    renamed = ResourceNames(
        mem="example.com/gpu-mem",
        core="example.com/gpu-core.percentage",
        count="example.com/gpu-count",
    )
    for docs, names in ((default_docs, ResourceNames()), (ci_docs, renamed)):
        chart = policy_docs(docs)
        expected = policy.handoff_policy(
            names=names,
            trusted_users=TRUSTED,
            excluded_namespaces=["kube-system", NAMESPACE],
            name=f"{RELEASE}-handoff",
        )
        for document in (*chart, *expected):
            document.pop("metadata")
        assert chart == expected
    (policy_doc, _) = policy_docs(default_docs)
    variables = {v["name"]: v["expression"] for v in policy_doc["spec"]["variables"]}
    assert "'aliyun.com/gpu-mem', 'aliyun.com/gpu-core.percentage'" in variables["asksGpushare"]
    assert "example.com/gpu-mem" in json.dumps(policy_docs(ci_docs)[0])
    without = render("--set", "webhook.policy.enabled=false")
    assert not [d for d in without if d["metadata"]["name"].endswith("-handoff")]


def test_cert_modes(default_docs: list[dict[str, Any]], ci_docs: list[dict[str, Any]]) -> None:
    job = find_job(default_docs, "webhook-certs")
    script = job["spec"]["template"]["spec"]["containers"][0]["args"][0]
    assert "openssl" in script and "caBundle" in script
    assert "cert-manager.io/inject-ca-from" not in webhook_config(default_docs)["metadata"].get(
        "annotations", {}
    )
    assert not [
        d for d in ci_docs if d["kind"] == "Job" and "webhook-certs" in d["metadata"]["name"]
    ]
    certificate = find(ci_docs, "Certificate")
    assert f"{RELEASE}-webhook.{NAMESPACE}.svc" in certificate["spec"]["dnsNames"]
    find(ci_docs, "Issuer")
    annotations = webhook_config(ci_docs)["metadata"]["annotations"]
    assert annotations["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/{RELEASE}-webhook"
    steering = find(ci_docs, "MutatingWebhookConfiguration", "-webhook")["metadata"]
    assert steering["annotations"] == annotations


def test_gpushare_flags_exist(
    default_docs: list[dict[str, Any]], ci_docs: list[dict[str, Any]]
) -> None:
    runner = CliRunner()
    helps: dict[str, str] = {}
    checked = 0
    for container in containers(default_docs) + containers(ci_docs):
        if not container["image"].startswith(GPUSHARE_IMAGE):
            continue
        command, *args = container["args"]
        if command not in helps:
            result = runner.invoke(cli, [command, "--help"])
            assert result.exit_code == 0, f"gpushare {command}: {result.output}"
            helps[command] = result.output
        for arg in args:
            flag = arg.split("=")[0]
            assert re.search(rf"{re.escape(flag)}\b", helps[command]), f"gpushare {command} {flag}"
            checked += 1
    assert set(helps) == {"extender", "device-plugin", "webhook", "seal-key"}
    assert checked > 20


def test_gpushare_parses_the_arguments_the_chart_gives(
    default_docs: list[dict[str, Any]],
    ci_docs: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each container's argument list parses as its command's flags (nothing is started)."""
    parsed = set()
    for container in containers(default_docs) + containers(ci_docs):
        if not container["image"].startswith(GPUSHARE_IMAGE):
            continue
        for variable in container.get("env", []):
            monkeypatch.setenv(variable["name"], variable.get("value", "from-the-downward-api"))
        command, *args = container["args"]
        with cli.commands[command].make_context(command, args) as context:
            assert context.params, f"gpushare {command} {args}"
        parsed.add(command)
    assert parsed == {"extender", "device-plugin", "webhook", "seal-key"}


def test_values_follow_into_every_component(ci_docs: list[dict[str, Any]]) -> None:
    for container in containers(ci_docs):
        if container["image"].startswith(GPUSHARE_IMAGE) and container["args"][0] != "seal-key":
            assert "--gpu-memory-unit=128MiB" in container["args"]
            assert "--mem-resource=example.com/gpu-mem" in container["args"]
    extender = find(ci_docs, "Deployment", "-scheduler")["spec"]["template"]["spec"]
    args = extender["containers"][1]["args"]
    assert "--policy=fgd" in args and "--max-pods-per-gpu=16" in args
    plugin = find(ci_docs, "DaemonSet", "-device-plugin")["spec"]["template"]["spec"]
    assert "--max-pods-per-gpu=16" in plugin["containers"][0]["args"]


@pytest.mark.parametrize(
    ("setting", "words"),
    [
        ("gpuMemoryUnit=2GiB", "gpuMemoryUnit"),
        ("policy=mostfree", "policy"),
        ("maxPodsPerGpu=0", "maxPodsPerGpu"),
        ("webhook.failurePolicy=Never", "failurePolicy"),
        ("webhook.certs.mode=vault", "mode"),
        ("webhook.trustedUsers[0]=", "trustedUsers"),
        ("webhook.policy.enabled=maybe", "enabled"),
        ("resourceNames.mem=gpu-mem", "mem"),
        ("testing.apiServer=127.0.0.1", "apiServer"),
        ("testing.fakeGpus=four", "fakeGpus"),
        ("testing.fakeTopology=star", "fakeTopology"),
        ("podMonitor.interval=often", "interval"),
        ("podMonitor.enabled=yes", "enabled"),
        ("scheduler.percentageOfNodesToScore=101", "percentageOfNodesToScore"),
        ("devicePlugin.nodeModes[0]=topology", "nodeModes"),
        ("scheduler.extender.logLevel=loud", "logLevel"),
        ("isolation.broker.maxConnectionsPerPod=0", "maxConnectionsPerPod"),
        ("isolation.broker.idleTimeoutSeconds=-1", "idleTimeoutSeconds"),
        ("webhook.nvidiaVisibleDevices=deny", "nvidiaVisibleDevices"),
        ("webhook.nvidiaVisibleDevicesExemptNamespaces[0]=GPU Operator", "ExemptNamespaces"),
        ("devicePlugin.startupTaint=not a key", "startupTaint"),
    ],
)
def test_schema_refuses(setting: str, words: str) -> None:
    result = helm(*template_args(), "--set", setting, check=False)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert words in result.stderr


def test_the_schema_offers_the_shared_modes_and_log_levels_the_commands_take() -> None:
    """The chart refuses what the device plugin and the log option would refuse at start."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    plugin = schema["properties"]["devicePlugin"]["properties"]
    assert plugin["nodeModes"]["items"]["enum"] == [mode.value for mode in SHARED_MODES]
    levels = [
        schema["properties"]["scheduler"]["properties"]["extender"]["properties"]["logLevel"],
        schema["properties"]["webhook"]["properties"]["logLevel"],
        plugin["logLevel"],
    ]
    assert all(level["enum"] == list(LEVELS) for level in levels)
    webhook = schema["properties"]["webhook"]["properties"]
    assert webhook["nvidiaVisibleDevices"]["enum"] == list(VISIBLE_DEVICES_MODES)


def _undescribed(node: dict[str, Any], path: str) -> Iterator[str]:
    """Every property under ``node`` (nested objects and array items too) that has no
    description, as a dotted path."""
    for name, child in (node.get("properties") or {}).items():
        where = f"{path}{name}"
        if not str(child.get("description", "")).strip():
            yield where
        yield from _undescribed(child, f"{where}.")
    if isinstance(node.get("items"), dict):
        yield from _undescribed(node["items"], f"{path}[].")


def test_every_value_in_the_schema_is_described() -> None:
    """`helm show values` users and editors that read JSON schemas (VS Code, Argo CD's
    parameter view) see each value's description: none may lack one."""
    for schema_file in sorted(CHART.parent.glob("*/values.schema.json")):
        schema = json.loads(schema_file.read_text())
        missing = list(_undescribed(schema, ""))
        assert not missing, f"{schema_file}: add a description to {', '.join(missing)}"


def test_without_a_cluster_the_unit_guard_renders_nothing() -> None:
    docs = render("--set", "gpuMemoryUnit=128MiB")
    assert not [d for d in docs if d["metadata"]["name"].endswith("unit-guard")]


def _pod_specs(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Pod templates by the workload's component label."""
    return {
        d["metadata"]["labels"]["app.kubernetes.io/component"]: d["spec"]["template"]["spec"]
        for d in docs
        if d["kind"] in {"Deployment", "DaemonSet", "Job"}
    }


def test_testing_values_reach_the_api_calling_pods_only(
    default_docs: list[dict[str, Any]],
) -> None:
    docs = render(
        "--set",
        "testing.apiServer=127.0.0.1:6443",
        "--set",
        "testing.fakeGpus=4x15GiB",
        "--set",
        "testing.fakeTopology=nvlink-pairs",
    )
    specs = _pod_specs(docs)
    calling = {"scheduler", "device-plugin", "webhook-certs", "seal"}
    assert set(specs) == {*calling, "webhook"}
    for component, spec in specs.items():
        assert spec.get("hostNetwork", False) is (component in calling), component
        for container in spec["containers"]:
            env = {e["name"]: e.get("value") for e in container.get("env", [])}
            want = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "6443"}
            got = {k: env.get(k) for k in want}
            assert got == (want if component in calling else dict.fromkeys(want)), container
    args = specs["device-plugin"]["containers"][0]["args"]
    assert "--fake-gpus=4x15GiB" in args and "--fake-topology=nvlink-pairs" in args
    assert find(docs, "Deployment", "-scheduler")["spec"]["strategy"] == {"type": "Recreate"}
    # the defaults carry none of it
    for component, spec in _pod_specs(default_docs).items():
        assert "hostNetwork" not in spec, component
        args = [a for c in spec["containers"] for a in c.get("args", [])]
        assert not [a for a in args if a.startswith("--fake-gpus")]
    assert "strategy" not in find(default_docs, "Deployment", "-scheduler")["spec"]


def test_pod_monitors_render_only_when_enabled_and_select_each_metrics_port() -> None:
    default = render()
    assert not [d for d in default if d["kind"] == "PodMonitor"]
    on = ["--set", "podMonitor.enabled=true", "--set", "podMonitor.labels.release=kps"]
    lint = helm(
        "lint",
        "--strict",
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--kube-version",
        KUBE_VERSION,
        *on,
    )
    assert "0 chart(s) failed" in lint.stdout
    docs = render(*on, "--set", "podMonitor.scrapeTimeout=10s")
    monitors = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PodMonitor"}
    assert sorted(monitors) == [
        f"{RELEASE}-device-plugin",
        f"{RELEASE}-scheduler",
        f"{RELEASE}-webhook",
    ]
    workloads = {
        d["metadata"]["labels"]["app.kubernetes.io/component"]: d
        for d in docs
        if d["kind"] in {"Deployment", "DaemonSet"}
    }
    for name, monitor in monitors.items():
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert monitor["metadata"]["namespace"] == NAMESPACE
        assert monitor["metadata"]["labels"]["release"] == "kps"
        component = monitor["metadata"]["labels"]["app.kubernetes.io/component"]
        template = workloads[component]["spec"]["template"]
        selector = monitor["spec"]["selector"]["matchLabels"]
        assert selector.items() <= template["metadata"]["labels"].items(), name
        # no other workload's pods match
        for other, workload in workloads.items():
            if other != component:
                assert (
                    not selector.items()
                    <= workload["spec"]["template"]["metadata"]["labels"].items()
                )
        [endpoint] = monitor["spec"]["podMetricsEndpoints"]
        ports = {p["name"] for c in template["spec"]["containers"] for p in c.get("ports", [])}
        assert endpoint["port"] in ports and endpoint["path"] == "/metrics"
        assert endpoint["interval"] == "30s" and endpoint["scrapeTimeout"] == "10s"
    webhook = monitors[f"{RELEASE}-webhook"]["spec"]["podMetricsEndpoints"][0]
    assert webhook["scheme"] == "https"
    secret = find(docs, "Deployment", "-webhook")["spec"]["template"]["spec"]["volumes"]
    secrets = {v["secret"]["secretName"] for v in secret if "secret" in v}
    assert webhook["tlsConfig"]["ca"]["secret"] == {
        "name": f"{RELEASE}-webhook-tls",
        "key": "ca.crt",
    }
    assert f"{RELEASE}-webhook-tls" in secrets
    assert webhook["tlsConfig"]["serverName"] == f"{RELEASE}-webhook.{NAMESPACE}.svc"
    # a component that serves no /metrics gets no monitor
    fewer = render(*on, "--set", "devicePlugin.metricsPort=0", "--set", "webhook.enabled=false")
    names = sorted(d["metadata"]["name"] for d in fewer if d["kind"] == "PodMonitor")
    assert names == [f"{RELEASE}-scheduler"]


def test_prometheus_rule_alerts_on_what_an_operator_needs_first() -> None:
    """Off by default; on, the alerts name the PodMonitors' jobs."""
    assert not [d for d in render() if d["kind"] == "PrometheusRule"]
    docs = render("--set", "prometheusRule.enabled=true", "--set", "podMonitor.enabled=true")
    rule = find(docs, "PrometheusRule")
    (group,) = rule["spec"]["groups"]
    alerts = {r["alert"]: r for r in group["rules"]}
    assert set(alerts) == {
        "GPUShareWebhookDown",
        "GPUShareWebhookCertificateNotReloaded",
        "GPUShareExtenderDown",
        "GPUShareExtenderCacheNotSynced",
        "GPUShareUntrustedAllocations",
        "GPUShareGPUUnhealthy",
        "GPUSharePodResourcesMismatch",
        "GPUShareExtenderWatchRefused",
        "GPUShareDevicePluginWatchRefused",
        "GPUShareDevicePluginMissing",
        "GPUShareDevicePluginAllocationFailures",
        "GPUShareBrokerConnectionsRefused",
    }
    monitors = {d["metadata"]["name"] for d in docs if d["kind"] == "PodMonitor"}
    for alert, monitor in (
        ("GPUShareWebhookDown", "webhook"),
        ("GPUShareExtenderDown", "scheduler"),
    ):
        assert f'job="{NAMESPACE}/{RELEASE}-{monitor}"' in alerts[alert]["expr"]
        assert f"{RELEASE}-{monitor}" in monitors
    # Prometheus's own parser and engine check the expressions:
    # tests/integration/chart/test_alerts.py; promtool: test_alert_rules.py


def test_helm_test_checks_the_webhook_through_its_service_and_ca() -> None:
    docs = render()
    pod = find(docs, "Pod", "-test")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    (container,) = pod["spec"]["containers"]
    script = container["args"][0]
    assert f"https://{RELEASE}-webhook.{NAMESPACE}.svc/readyz" in script
    assert 'cafile="/certs/ca.crt"' in script


def test_every_component_takes_extra_args_env_and_an_update_strategy() -> None:
    """What the chart does not foresee needs no fork (issue 40)."""
    sets = []
    for component in ("scheduler", "devicePlugin", "webhook"):
        sets += [
            "--set",
            f"{component}.extraArgs={{--log-level=debug}}",
            "--set",
            f"{component}.extraEnv[0].name=EXTRA",
            "--set",
            f"{component}.extraEnv[0].value={component}",
            "--set",
            f"{component}.updateStrategy.type="
            + ("OnDelete" if component == "devicePlugin" else "Recreate"),
        ]
    docs = render(*sets)
    for kind, suffix, index, component in (
        ("Deployment", "-scheduler", 1, "scheduler"),
        ("DaemonSet", "-device-plugin", 0, "devicePlugin"),
        ("Deployment", "-webhook", 0, "webhook"),
    ):
        workload = find(docs, kind, suffix)
        container = workload["spec"]["template"]["spec"]["containers"][index]
        assert container["args"][-1] == "--log-level=debug"
        assert {"name": "EXTRA", "value": component} in container["env"]
        strategy = workload["spec"]["strategy" if kind == "Deployment" else "updateStrategy"]
        assert strategy["type"] in ("Recreate", "OnDelete")
    webhook = find(render(), "Deployment", "-webhook")["spec"]["template"]["spec"]
    assert webhook["priorityClassName"] == "system-cluster-critical"


def test_the_default_image_is_the_release_image(default_docs: list[dict[str, Any]]) -> None:
    """The chart runs what `make release` builds and would push: the recipe's repository at
    the project's version, which is also the chart's appVersion and, in SemVer spelling, its
    version."""
    import importlib
    import sys

    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    sys.path.insert(0, str(REPO / "packaging"))
    try:
        semver = importlib.import_module("release").semver
    finally:
        sys.path.remove(str(REPO / "packaging"))
    assert chart["appVersion"] == project_version()
    assert chart["version"] == semver(project_version())
    images = {c["image"] for c in containers(default_docs) if "gpushare" in c["image"]}
    assert images == {f"{recipe_repository()}:{project_version()}"}
    assert recipe_repository().startswith("ghcr.io/")


def test_a_mirror_sets_the_registry_or_the_whole_name() -> None:
    mirrored = render("--set", "image.registry=mirror.example:5000", "--set-string", "image.tag=1")
    assert {c["image"] for c in containers(mirrored) if "gpushare/gpushare" in c["image"]} == {
        "mirror.example:5000/gpushare/gpushare:1"
    }
    whole = render("--set", "image.registry=", "--set", "image.repository=reg.example/gp")
    names = {c["image"] for c in containers(whole)}
    assert f"reg.example/gp:{project_version()}" in names
    assert not [n for n in names if "ghcr.io" in n]


def test_the_notes_install_the_plugin_from_what_a_release_publishes(tmp_path: Path) -> None:
    """`pip install gpushare` installs another project's code (that PyPI name is not ours), and
    nothing is on PyPI under ours: the notes point at the krew manifest each release attaches
    (.github/workflows/release.yml), by the URL packaging/release.py writes into it."""
    notes = render_notes(tmp_path)
    assert "pip install" not in notes
    version = project_version()
    assert (
        "kubectl krew install --manifest-url=https://github.com/gpushare/gpushare/releases/"
        f"download/v{version}/inspect-cgpu.yaml"
    ) in notes
    assert "kubectl inspect-cgpu" in notes  # krew's link is kubectl-inspect_cgpu
    release = (REPO / "packaging" / "release.py").read_text()
    assert 'RELEASES = "https://github.com/gpushare/gpushare/releases/download"' in release
    assert 'manifest = out / "inspect-cgpu.yaml"' in release


def test_recreating_refused_bare_pods_is_opt_in_with_its_rights() -> None:
    """Creating pods in every namespace is a right to run any ServiceAccount there (issue 41)."""

    def extender_and_rules(*args: str) -> tuple[list[str], list[dict[str, Any]]]:
        docs = render(*args)
        container = find(docs, "Deployment", "-scheduler")["spec"]["template"]["spec"][
            "containers"
        ][1]
        roles = [d for d in docs if d["kind"] == "ClusterRole"]
        rules = [r for role in roles for r in role.get("rules", [])]
        return container["args"], [r for r in rules if "pods" in r.get("resources", [])]

    args, rules = extender_and_rules()
    assert "--no-recreate-refused-pods" in args
    assert not any({"create", "delete"} & set(r["verbs"]) for r in rules)
    args, rules = extender_and_rules("--set", "scheduler.extender.recreateRefusedPods=true")
    assert "--recreate-refused-pods" in args
    assert any({"create", "delete"} <= set(r["verbs"]) for r in rules)


def test_image_digest_pins_every_gpushare_container_and_is_checked() -> None:
    """image.digest (each release prints it; cosign signs it) replaces the tag in every pod that
    runs the gpushare image; a digest that is not sha256:<64 hex> is refused by the schema."""
    digest = "sha256:" + "0123456789abcdef" * 4
    docs = render("--set", f"image.digest={digest}", "--set", "image.tag=ignored")
    images = [
        c["image"]
        for d in docs
        for c in (
            d.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])
            + d.get("spec", {}).get("containers", [])
        )
        if "gpushare/gpushare" in c["image"]
    ]
    assert len(images) >= 4 and set(images) == {f"ghcr.io/gpushare/gpushare@{digest}"}
    bad = helm(*template_args(), "--set", "image.digest=sha256:abc", check=False)
    assert bad.returncode != 0
    assert "/image/digest" in bad.stderr and "sha256:[a-f0-9]{64}" in bad.stderr


def test_the_plugin_asks_the_runtime_it_hands_gpus_to(default_docs: list[dict[str, Any]]) -> None:
    """devicePlugin.handOffCheck: the CRI socket's directory under cdi-cri, the toolkit's under
    envvar, read-only; nothing under off (issue 59, PLATFORMS.md C5)."""
    pod = find(default_docs, "DaemonSet", "-device-plugin")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = container["args"]
    assert "--hand-off-check=refuse" in args and "--cri-socket=/host/cri/containerd.sock" in args
    assert "--cdi-spec-host-dirs=/etc/cdi,/var/run/cdi" in args
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["cri-socket"] == {
        "name": "cri-socket",
        "mountPath": "/host/cri",
        "readOnly": True,
    }
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["cri-socket"]["hostPath"] == {
        "path": "/run/containerd",
        "type": "DirectoryOrCreate",
    }
    k3s = render(
        "--set",
        "devicePlugin.criSocketPath=/run/k3s/containerd/containerd.sock",
        "--set",
        "devicePlugin.handOffCheck=warn",
    )
    pod = find(k3s, "DaemonSet", "-device-plugin")["spec"]["template"]["spec"]
    assert "--hand-off-check=warn" in pod["containers"][0]["args"]
    assert {v["name"]: v for v in pod["volumes"]}["cri-socket"]["hostPath"]["path"] == (
        "/run/k3s/containerd"
    )
    envvar = render("--set", "devicePlugin.deviceListStrategy=envvar")
    pod = find(envvar, "DaemonSet", "-device-plugin")["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert "--toolkit-config=/host/nvidia-container-runtime/config.toml" in args
    assert not [a for a in args if a.startswith("--cri-socket")]
    assert {v["name"]: v for v in pod["volumes"]}["toolkit-config"]["hostPath"]["path"] == (
        "/etc/nvidia-container-runtime"
    )
    off = render("--set", "devicePlugin.handOffCheck=off")
    pod = find(off, "DaemonSet", "-device-plugin")["spec"]["template"]["spec"]
    assert "--hand-off-check=off" in pod["containers"][0]["args"]
    assert not {"cri-socket", "toolkit-config"} & {v["name"] for v in pod["volumes"]}


def test_helm_test_runs_a_gpu_pod_that_checks_its_hand_off(
    default_docs: list[dict[str, Any]],
) -> None:
    pod = find(default_docs, "Pod", "-test-gpu-pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    spec = pod["spec"]
    assert spec["schedulerName"] == "ack-co-scheduler"
    (container,) = spec["containers"]
    assert container["image"].startswith(GPUSHARE_IMAGE)
    assert container["args"] == ["check-hand-off"]
    assert container["resources"] == {"limits": {"aliyun.com/gpu-mem": 1}}
    # Pod Security "restricted"
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert cli.commands["check-hand-off"].make_context("check-hand-off", container["args"][1:])
    steered = render(
        "--set",
        "testing.fakeGpus=1x15GiB",
        "--set",
        "tests.gpuPod.nodeSelector.gpu=yes",
        "--set",
        "tests.gpuPod.tolerations[0].key=nvidia.com/gpu",
        "--set",
        "tests.gpuPod.tolerations[0].operator=Exists",
        "--set",
        "scheduler.schedulerName=gpushare",
    )
    spec = find(steered, "Pod", "-test-gpu-pod")["spec"]
    assert spec["schedulerName"] == "gpushare" and spec["nodeSelector"] == {"gpu": "yes"}
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    assert spec["containers"][0]["args"] == ["check-hand-off", "--no-control-device"]
    off = render("--set", "tests.gpuPod.enabled=false")
    assert not [d for d in off if d["metadata"]["name"].endswith("-test-gpu-pod")]
