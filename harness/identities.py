"""The identities the chart gives gpushare's components, for the e2e tests to run them with.

The e2e tests once ran the device plugin and the extender with the harness's admin
credentials, which hid that the chart's own ClusterRole refused the plugin's pod watch: every
pod stayed unmarked and the hand-off rule held later pods Pending. So, by default, each
component runs here as the chart runs it:

- the chart's ServiceAccounts, ClusterRoles and bindings (``deviceplugin-rbac.yaml``,
  ``scheduler-rbac.yaml``) and the device plugin's ValidatingAdmissionPolicies
  (``deviceplugin-policy.yaml``), rendered by ``helm template`` from charts/gpushare and applied
  once per cluster (:func:`apply_chart_identities`);
- a token of the component's ServiceAccount (``kubectl create token``) in a kubeconfig
  (:func:`token_kubeconfig`). The device plugin's is bound to its node
  (``--bound-object-kind Node``), so the API server puts the node's name into the user's
  extra as it does for the token kubelet mounts into the DaemonSet's pod, and the node policy
  holds it to that node.

The DRA driver's identity (``dra-driver.yaml``: its ServiceAccount and RBAC, rendered with
``dra.enabled=true``, without the DaemonSet) is applied when a test first runs the driver
(:func:`dra_driver_kubeconfig`).

The webhook makes no API call (its ServiceAccount has no rules and mounts no token), so there
is no identity to give it. The chart's tenant-facing policy (``webhook-policy.yaml``) is not
applied by default: it refuses gpushare annotations written by anyone but the components, and
tests write forged ones as admin on purpose to check what stands behind it; tests of the
policy apply it themselves (:func:`chart_documents`).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any, Protocol

import yaml


class ControlPlane(Protocol):
    """What the identities need of a running control plane (``harness.cluster.Cluster``), so
    that the cluster, which asks for the extender's kubeconfig here, is not imported back."""

    root: Path
    binaries: dict[str, Path]

    @property
    def pki(self) -> Path: ...

    @property
    def server(self) -> str: ...

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]: ...

    def kubectl_json(self, *args: str) -> Any: ...

    def create_namespace(self, name: str, *, check: bool = True) -> bool: ...


REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "gpushare"
RELEASE = "gpushare"
NAMESPACE = "gpushare-system"
DEVICE_PLUGIN_SA = f"{RELEASE}-device-plugin"
SCHEDULER_SA = f"{RELEASE}-scheduler"
DRA_DRIVER_SA = f"{RELEASE}-dra-driver"
IDENTITY_TEMPLATES = (
    "templates/deviceplugin-rbac.yaml",
    "templates/deviceplugin-policy.yaml",
    "templates/scheduler-rbac.yaml",
)
EXTENDER_VALUES = ("--set", "scheduler.extender.recreateRefusedPods=true")
"""The harness runs the extender with ``--recreate-refused-pods`` (its command's default), so
the role it gets is the chart's for that setting."""
TOKEN_DURATION = "48h"


def chart_documents(
    cluster: ControlPlane,
    templates: tuple[str, ...],
    *,
    release: str = RELEASE,
    namespace: str = NAMESPACE,
    values: tuple[str, ...] = (),
) -> list[dict[str, Any]]:
    """``templates`` of charts/gpushare as ``helm template`` renders them (default values and
    ``values``) for this cluster's Kubernetes version."""
    version = cluster.kubectl_json("version")["serverVersion"]["gitVersion"]
    helm_home = cluster.root / "helm-identities"
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(helm_home / "cache"),
        "HELM_CONFIG_HOME": str(helm_home / "config"),
        "HELM_DATA_HOME": str(helm_home / "data"),
    }
    shown = [arg for t in templates for arg in ("--show-only", t)]
    result = subprocess.run(
        [
            str(cluster.binaries["helm"]),
            "template",
            release,
            str(CHART),
            "--namespace",
            namespace,
            *shown,
            *values,
            "--kube-version",
            version,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def apply_chart_identities(cluster: ControlPlane) -> None:
    """Apply the chart's ServiceAccounts, RBAC and device plugin policies (once per cluster;
    again when a test changed them)."""
    cluster.create_namespace(NAMESPACE, check=False)
    documents = chart_documents(cluster, IDENTITY_TEMPLATES, values=EXTENDER_VALUES)
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(documents))


def token_kubeconfig(
    cluster: ControlPlane,
    token: str,
    path: Path,
    *,
    user: str = "device-plugin",
    namespace: str = "",
) -> Path:
    """A kubeconfig that authenticates with a bearer token (a ServiceAccount's), its context
    naming ``namespace`` when given, as one handed to a tenant does."""
    context: dict[str, str] = {"cluster": "e2e", "user": user}
    if namespace:
        context["namespace"] = namespace
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "e2e",
                "cluster": {
                    "server": cluster.server,
                    "certificate-authority": str(cluster.pki / "ca.crt"),
                },
            }
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "e2e", "context": context}],
        "current-context": "e2e",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def tenant_kubeconfig(
    cluster: ControlPlane, namespace: str, path: Path, *, role: str, resources: str
) -> Path:
    """The kubeconfig of a ServiceAccount ``inspector`` of ``namespace`` whose Role ``role`` may
    only get and list ``resources`` (kubectl's comma-separated form) there, as a platform team
    hands one to a tenant (:func:`token_kubeconfig`)."""
    ns = ("-n", namespace)
    cluster.kubectl(*ns, "create", "serviceaccount", "inspector")
    cluster.kubectl(*ns, "create", "role", role, "--verb=get,list", f"--resource={resources}")
    cluster.kubectl(
        *ns,
        "create",
        "rolebinding",
        "inspector",
        f"--role={role}",
        f"--serviceaccount={namespace}:inspector",
    )
    token = cluster.kubectl(*ns, "create", "token", "inspector").stdout.strip()
    return token_kubeconfig(cluster, token, path, user="inspector", namespace=namespace)


def service_account_kubeconfig(
    cluster: ControlPlane, account: str, path: Path, *, node: str = ""
) -> Path:
    """A kubeconfig with a fresh token of the chart's ServiceAccount ``account``; bound to
    ``node`` when given (its name then in the user's extra, as in the DaemonSet's pod)."""
    bound = ("--bound-object-kind", "Node", "--bound-object-name", node) if node else ()
    token = cluster.kubectl(
        "create", "token", account, "-n", NAMESPACE, "--duration", TOKEN_DURATION, *bound
    ).stdout.strip()
    return token_kubeconfig(cluster, token, path, user=account)


def device_plugin_kubeconfig(cluster: ControlPlane, node: str) -> Path:
    """The device plugin's identity on ``node``, with the chart's RBAC and policies applied."""
    apply_chart_identities(cluster)
    return service_account_kubeconfig(
        cluster, DEVICE_PLUGIN_SA, cluster.root / f"device-plugin-{node}.kubeconfig", node=node
    )


def extender_kubeconfig(cluster: ControlPlane) -> Path:
    """The extender's identity (the scheduler pod's ServiceAccount), RBAC applied."""
    apply_chart_identities(cluster)
    return service_account_kubeconfig(cluster, SCHEDULER_SA, cluster.root / "extender.kubeconfig")


def dra_driver_kubeconfig(cluster: ControlPlane, node: str) -> Path:
    """The DRA driver's identity on ``node``: the chart's ServiceAccount and RBAC applied, a
    token bound to the node."""
    cluster.create_namespace(NAMESPACE, check=False)
    documents = chart_documents(
        cluster, ("templates/dra-driver.yaml",), values=("--set", "dra.enabled=true")
    )
    identity = [d for d in documents if d["kind"] != "DaemonSet"]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(identity))
    return service_account_kubeconfig(
        cluster, DRA_DRIVER_SA, cluster.root / f"dra-driver-{node}.kubeconfig", node=node
    )
