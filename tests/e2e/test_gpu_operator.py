"""NVIDIA's components beside gpushare, on the real control plane with the chart installed.

The chart is installed with ``helm install`` into the real API server; its webhook Deployment
cannot run here (kwok nodes have no kubelet), so the test runs ``gpushare webhook`` as a local
process with exactly the arguments the installed Deployment carries (only where it listens and
its certificate differ), and points the chart's own ValidatingWebhookConfiguration at it
(``clientConfig.url``, ``failurePolicy: Fail``). Its namespace selector is the chart's: every
namespace carrying this run's label, but kube-system and the release namespace.

What it shows:

- Under the chart's defaults (``devicePlugin.deviceListStrategy=cdi-cri``,
  ``webhook.nvidiaVisibleDevices=auto``), DaemonSets shaped like the GPU Operator's device
  plugin, dcgm-exporter, GPU feature discovery and validator, each with
  ``NVIDIA_VISIBLE_DEVICES=all``, are admitted in namespace ``gpu-operator`` and in another
  namespace, and the DaemonSet controller's pods for them are admitted too (one per DaemonSet on
  a kwok node labelled for them, re-created after a delete); NVIDIA's k8s-device-plugin
  DaemonSet, kept off gpushare's nodes by node affinity, is admitted in its chart's namespace
  (``nvidia-device-plugin``, exempt by default). A tenant's unprivileged pod setting the
  variable is refused under the same defaults (the webhook cannot see whether the nodes'
  toolkit ignores it).
- With ``webhook.nvidiaVisibleDevices=refuse`` (``helm upgrade``), a tenant's pod that sets the
  variable is refused outside the exempt namespaces, with a message naming the variable, the
  rule and what to do, while the GPU Operator's pods in ``gpu-operator`` keep being admitted.

What it cannot show: what a node's NVIDIA runtime does with the variable. That is the toolkit's
setting, described (from NVIDIA's documentation, not tested here) in docs/gpu-operator.md.
"""

from __future__ import annotations

import json
import ssl
import sys
import tempfile
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.core.admitting.tampering import DEFAULT_EXEMPT_NAMESPACES
from harness.cluster import Cluster, Process, free_port, wait_for
from harness.seeding import kwok_node
from tests.support.e2e import CHART, create_nodes, delete_nodes, eventually, helm
from tests.support.nvidia_shapes import GPU_OPERATOR_SHAPES, k8s_device_plugin, tenant_pod
from tests.support.pki import serving_pki

RELEASE = "gpushare-gpuop"
OPERATOR_NS = "gpu-operator"
PLUGIN_NS = "nvidia-device-plugin"
"""Where NVIDIA's k8s-device-plugin chart installs (exempt by default)."""
LABEL = "gpushare.io/e2e-gpuop"
DENIED = 'admission webhook "validate.gpushare.io" denied the request'
MEM = "aliyun.com/gpu-mem"


@dataclass
class ChartWebhook:
    """The installed chart's webhook, served by a local process; restartable after upgrades."""

    cluster: Cluster
    namespace: str
    suffix: str
    ca: Path
    cert: Path
    key: Path
    port: int = field(default_factory=free_port)
    process: Process | None = None
    args: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def manifest(self) -> list[dict[str, Any]]:
        text = helm(self.cluster, "get", "manifest", RELEASE, "-n", self.namespace).stdout
        return [d for d in yaml.safe_load_all(text) if d]

    def chart_args(self) -> list[str]:
        """The installed webhook Deployment's arguments, but where it listens and its cert."""
        (deployment,) = [
            d
            for d in self.manifest()
            if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-webhook")
        ]
        args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        local = ("--host", "--port", "--tls-cert-file", "--tls-private-key-file")
        return [a for a in args if not a.startswith(local)]

    def start(self) -> None:
        """(Re)start the local process with the chart's current arguments; wait until healthy."""
        self.stop()
        self.args = self.chart_args()
        assert self.args[0] == "webhook", self.args
        self.process = Process(
            f"gpushare-webhook-gpuop-{self.port}",
            [
                str(Path(sys.executable).parent / "gpushare"),
                *self.args,
                "--host=127.0.0.1",
                f"--port={self.port}",
                f"--tls-cert-file={self.cert}",
                f"--tls-private-key-file={self.key}",
            ],
            self.cluster.root / "logs" / "webhook-gpuop.log",
        )
        self.process.start()
        context = ssl.create_default_context(cafile=str(self.ca))

        def healthy() -> bool:
            with urllib.request.urlopen(f"{self.url}/healthz", context=context, timeout=2) as a:
                return bool(a.status == 200)

        wait_for("the chart's webhook, run locally, /healthz", healthy, 30, self.process)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None

    def point_the_chart_configuration_here(self) -> None:
        """Send the chart's ValidatingWebhookConfiguration to the local process, under Fail."""
        import base64

        bundle = base64.b64encode(self.ca.read_bytes()).decode()
        self._patch({"url": f"{self.url}/validate", "caBundle": bundle}, "Fail")

    def give_the_configuration_back(self) -> None:
        """The chart's own clientConfig and failurePolicy again, so that helm can upgrade it."""
        (configuration,) = [
            d for d in self.manifest() if d["kind"] == "ValidatingWebhookConfiguration"
        ]
        webhook = configuration["webhooks"][0]
        self._patch(webhook["clientConfig"], webhook["failurePolicy"])

    def _patch(self, client: dict[str, Any], policy: str) -> None:
        patch = [
            {"op": "replace", "path": "/webhooks/0/clientConfig", "value": client},
            {"op": "replace", "path": "/webhooks/0/failurePolicy", "value": policy},
        ]
        self.cluster.kubectl(
            "patch",
            "validatingwebhookconfiguration",
            f"{RELEASE}-webhook",
            "--type=json",
            "-p",
            json.dumps(patch),
        )


def apply(cluster: Cluster, obj: dict[str, Any], dry: bool = False) -> Any:
    extra = ["--dry-run=server"] if dry else []
    return cluster.kubectl("apply", *extra, "-f", "-", input=json.dumps(obj), check=False)


def namespace(cluster: Cluster, name: str, suffix: str) -> None:
    cluster.create_namespace(name, check=False)
    cluster.kubectl("label", "namespace", name, f"{LABEL}={suffix}", "--overwrite")


def wait_active(cluster: Cluster, hooked: ChartWebhook, where: str) -> None:
    """Until the API server calls the local webhook: LD_PRELOAD on a GPU pod is refused.

    (A rule only the webhook holds: the chart's ValidatingAdmissionPolicy, which runs first,
    would answer a forged annotation itself.)
    """
    probe = tenant_pod(where, "probe")
    probe["spec"]["containers"][0]["env"] = [{"name": "LD_PRELOAD", "value": "/x.so"}]
    probe["spec"]["containers"][0]["resources"] = {"limits": {MEM: "1"}}

    def active() -> bool:
        return DENIED in apply(cluster, probe, dry=True).stderr

    wait_for("the chart's webhook configuration to call the local webhook", active, 60,
             hooked.process)  # fmt: skip


def install(cluster: Cluster, ns: str, suffix: str, *values: str) -> None:
    helm(
        cluster, "upgrade", "--install", RELEASE, str(CHART), "-n", ns, "--wait=false",
        "--set", "scheduler.enabled=false",
        "--set", "devicePlugin.enabled=false",
        "--set", "webhook.replicas=1",
        "--set", "webhook.steer.enabled=false",
        "--set", "webhook.failurePolicy=Ignore",
        "--set-string", f"webhook.namespaceLabels.gpushare\\.io/e2e-gpuop={suffix}",
        *values,
    )  # fmt: skip


@pytest.fixture(scope="module")
def chart(cluster: Cluster) -> Iterator[ChartWebhook]:
    suffix = uuid.uuid4().hex[:6]
    release_ns = f"gpushare-gpuop-{suffix}"
    root = Path(tempfile.mkdtemp(prefix="gs-gpuop-", dir="/tmp"))
    ca, cert, key = serving_pki(root)
    hooked = ChartWebhook(cluster, release_ns, suffix, ca, cert, key)
    for ns in (OPERATOR_NS, PLUGIN_NS):
        cluster.kubectl("delete", "namespace", ns, "--ignore-not-found", "--wait=true",
                        timeout=180)  # fmt: skip
    cluster.create_namespace(release_ns)
    try:
        install(cluster, release_ns, suffix)
        hooked.start()
        hooked.point_the_chart_configuration_here()
        yield hooked
    finally:
        if hooked.process is not None:
            print(f"[e2e] webhook log tail:\n{hooked.process.tail(15)}", flush=True)
        hooked.stop()
        helm(cluster, "uninstall", RELEASE, "-n", release_ns, "--wait", check=False)
        for ns in (release_ns, OPERATOR_NS, PLUGIN_NS):
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def _daemonset_pods(cluster: Cluster, ns: str, name: str) -> list[dict[str, Any]]:
    pods = cluster.kubectl_json("get", "pods", "-n", ns, "-l", f"app={name}")["items"]
    return [p for p in pods if p["metadata"].get("deletionTimestamp") is None]


def _created_events(cluster: Cluster, ns: str, name: str) -> str:
    events = cluster.kubectl(
        "get", "events", "-n", ns, "--field-selector", f"involvedObject.name={name}",
        check=False,
    )  # fmt: skip
    return events.stdout[-2000:]


def test_nvidias_daemonsets_are_admitted_under_the_chart_defaults(
    cluster: Cluster, chart: ChartWebhook
) -> None:
    suffix = chart.suffix
    elsewhere = f"gpuop-elsewhere-{suffix}"
    plugin_ns = PLUGIN_NS
    for ns in (OPERATOR_NS, elsewhere, plugin_ns):
        namespace(cluster, ns, suffix)
    wait_active(cluster, chart, elsewhere)

    # A GPU node gpushare does not manage, labelled for this run's DaemonSets only.
    node = kwok_node(f"gpuop-{suffix}", mode=None, gpus_units=())
    picked = {"gpushare-e2e-gpuop": suffix}
    node["metadata"]["labels"].update(
        {
            **picked,
            "nvidia.com/gpu.present": "true",
            **{f"nvidia.com/gpu.deploy.{operand}": "true" for operand in GPU_OPERATOR_SHAPES},
        }
    )
    create_nodes(cluster, [node])
    try:
        made: list[tuple[str, str]] = []
        for ns in (OPERATOR_NS, elsewhere):
            for shape in GPU_OPERATOR_SHAPES.values():
                daemonset = shape(ns, picked)
                result = apply(cluster, daemonset)
                assert result.returncode == 0, f"{ns}: {result.stderr}"
                made.append((ns, daemonset["metadata"]["name"]))
        plugin = k8s_device_plugin(plugin_ns, picked)
        result = apply(cluster, plugin)
        assert result.returncode == 0, result.stderr
        # the DaemonSet controller's pods pass the same webhook (Pod CREATE)
        for ns, name in made:
            eventually(
                lambda ns=ns, name=name: _daemonset_pods(cluster, ns, name),
                60,
                f"{ns}/{name}'s pod created\n{_created_events(cluster, ns, name)}",
            )
        eventually(
            lambda: cluster.kubectl_json(
                "get", "pods", "-n", plugin_ns, "-l", "app.kubernetes.io/name=nvidia-device-plugin"
            )["items"],
            60,
            "NVIDIA's device plugin pod created",
        )
        # a deleted operand pod is re-created (the issue: it stayed at 0 of 1, FailedCreate)
        ns, name = OPERATOR_NS, "nvidia-device-plugin-daemonset"
        (old,) = _daemonset_pods(cluster, ns, name)
        cluster.kubectl("delete", "pod", "-n", ns, old["metadata"]["name"], "--wait=false")
        eventually(
            lambda: [
                p
                for p in _daemonset_pods(cluster, ns, name)
                if p["metadata"]["uid"] != old["metadata"]["uid"]
            ],
            60,
            f"{name}'s pod re-created\n{_created_events(cluster, ns, name)}",
        )
        # what the chart told its webhook: auto, beside the device plugin's cdi-cri
        assert "--nvidia-visible-devices=auto" in chart.args
        assert "--device-list-strategy=cdi-cri" in chart.args
        # issue 56: a tenant's own NVIDIA_VISIBLE_DEVICES=all was admitted under these defaults
        greedy = apply(cluster, tenant_pod(elsewhere, "greedy"), dry=True)
        assert greedy.returncode != 0, greedy.stdout
        for words in (
            DENIED,
            f"NVIDIA_VISIBLE_DEVICES='all' is refused on every pod (from unprivileged "
            f"containers) in namespace '{elsewhere}', which is not exempt from this rule",
            "device-list strategy cdi-cri",
            "set webhook.nvidiaVisibleDevices=allow with CDI hand-off",
        ):
            assert words in greedy.stderr, (words, greedy.stderr)
        print(f"[e2e] a tenant's variable, defaults:\n{greedy.stderr}", flush=True)
    finally:
        delete_nodes(cluster, [node["metadata"]["name"]])
        cluster.kubectl("delete", "namespace", elsewhere, "--wait=false", check=False)


def test_with_refuse_a_tenant_pod_setting_it_is_refused_outside_the_exempt_list(
    cluster: Cluster, chart: ChartWebhook
) -> None:
    suffix = chart.suffix
    tenant = f"gpuop-tenant-{suffix}"
    for ns in (OPERATOR_NS, tenant):
        namespace(cluster, ns, suffix)
    chart.give_the_configuration_back()
    install(cluster, chart.namespace, suffix, "--set", "webhook.nvidiaVisibleDevices=refuse")
    chart.start()
    chart.point_the_chart_configuration_here()  # the upgrade put the chart's clientConfig back
    assert "--nvidia-visible-devices=refuse" in chart.args
    assert f"--nvidia-visible-devices-exempt-namespace={chart.namespace}" in chart.args
    try:
        wait_active(cluster, chart, tenant)

        def refused() -> Any:
            result = apply(cluster, tenant_pod(tenant, "greedy"))
            return result if "NVIDIA_VISIBLE_DEVICES" in result.stderr else None

        # the process restarted on the same port: wait until it answers with the new rule
        result = eventually(refused, 60, "the tenant pod refused under refuse")
        assert result.returncode != 0
        print(f"[e2e] kubectl apply of the tenant pod:\n{result.stderr}", flush=True)
        for words in (
            DENIED,
            f"Pod {tenant}/greedy is refused",
            'container "main" (spec.containers[0].env[0])',
            f"NVIDIA_VISIBLE_DEVICES='all' is refused on every pod in namespace '{tenant}', "
            "which is not exempt from this rule",
            "mounts every GPU it names into the container",
            "nvidia-visible-devices mode refuse",
            "remove it",
            "webhook.nvidiaVisibleDevicesExemptNamespaces; now "
            f"{', '.join(sorted([chart.namespace, *DEFAULT_EXEMPT_NAMESPACES]))}",
            "accept-nvidia-visible-devices-envvar-when-unprivileged = false",
        ):
            assert words in result.stderr, words
        missing = cluster.kubectl("get", "pod", "greedy", "-n", tenant, check=False)
        assert missing.returncode != 0  # nothing was stored
        privileged = apply(cluster, tenant_pod(tenant, "greedy-root", privileged=True))
        assert privileged.returncode != 0 and "NVIDIA_VISIBLE_DEVICES='all'" in privileged.stderr
        # 'void' hides every GPU: allowed
        hiding = tenant_pod(tenant, "hides")
        hiding["spec"]["containers"][0]["env"] = [
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}
        ]
        assert apply(cluster, hiding, dry=True).returncode == 0

        # the GPU Operator keeps working in its exempt namespace, not elsewhere
        for shape in GPU_OPERATOR_SHAPES.values():
            there = apply(cluster, shape(OPERATOR_NS, {"gpushare-e2e": "nowhere"}), dry=True)
            assert there.returncode == 0, there.stderr
            here = apply(cluster, shape(tenant, {"gpushare-e2e": "nowhere"}), dry=True)
            assert here.returncode != 0 and "NVIDIA_VISIBLE_DEVICES='all'" in here.stderr
    finally:
        cluster.kubectl("delete", "namespace", tenant, "--wait=false", check=False)
