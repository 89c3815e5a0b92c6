"""The admission webhook on the real control plane: kubectl apply of a bad Job is refused.

``gpushare webhook`` runs as its own process with an openssl-made serving certificate for
127.0.0.1; the ValidatingWebhookConfiguration is the one ``gpushare webhook-config`` prints
(default failurePolicy), with ``clientConfig.url`` and a namespace label so only this test's
namespace is checked. The configuration is deleted at the end.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.webhook.configuration import CONFIGURATION_NAME
from harness.cluster import Cluster, Process, free_port, wait_for
from tests.support.pki import serving_pki

NS = "e2e-webhook"
SELECTOR = ("gpushare-e2e-webhook", "on")
MEM = "aliyun.com/gpu-mem"
CORE = "aliyun.com/gpu-core.percentage"
DENIED = 'admission webhook "validate.gpushare.io" denied the request'


def job(name: str, limits: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "schedulerName": "ack-co-scheduler",
                    "restartPolicy": "Never",
                    # no node carries this label: the pod is created (and admitted) but
                    # stays Pending, so it takes no GPU from the other e2e tests
                    "nodeSelector": {"gpushare-e2e": "webhook-nowhere"},
                    "containers": [
                        {"name": "trainer", "image": "busybox", "resources": {"limits": limits}}
                    ],
                }
            },
        },
    }


def apply(cluster: Cluster, manifest: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest), check=False)


@pytest.fixture(scope="module")
def webhook(cluster: Cluster) -> Iterator[tuple[str, ssl.SSLContext]]:
    """Run gpushare webhook, register it for the test namespace; yield its URL and CA."""
    root = Path(tempfile.mkdtemp(prefix="gs-webhook-", dir="/tmp"))
    ca, cert, key = serving_pki(root)
    port = free_port()
    url = f"https://127.0.0.1:{port}"
    process = Process(
        "gpushare-webhook",
        [
            str(Path(sys.executable).parent / "gpushare"),
            "webhook",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--tls-cert-file",
            str(cert),
            "--tls-private-key-file",
            str(key),
            # the strict reading of NVIDIA_VISIBLE_DEVICES (nodes that honour it), so the
            # hostile pod below is refused for every variable it sets
            "--nvidia-visible-devices",
            "refuse",
        ],
        cluster.root / "logs" / "webhook.log",
    )
    process.start()
    context = ssl.create_default_context(cafile=str(ca))

    def healthy() -> bool:
        with urllib.request.urlopen(f"{url}/healthz", context=context, timeout=2) as answer:
            return bool(answer.status == 200)

    rendered = subprocess.run(
        [
            str(Path(sys.executable).parent / "gpushare"),
            "webhook-config",
            "--url",
            f"{url}/validate",
            "--ca-bundle-file",
            str(ca),
            "--namespace-label",
            "=".join(SELECTOR),
            "--nvidia-visible-devices",
            "refuse",  # as the server above: pods setting it are sent too
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    configurations = list(yaml.safe_load_all(rendered))
    assert [c["kind"] for c in configurations] == [
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
    ]
    name = configurations[0]["metadata"]["name"]
    try:
        wait_for("gpushare webhook /healthz over TLS", healthy, 30, process)
        cluster.create_namespace(NS)
        cluster.kubectl("label", "namespace", NS, "=".join(SELECTOR))
        cluster.kubectl("apply", "-f", "-", input=rendered)
        probe = json.dumps(job("probe", {MEM: 2, CORE: 33}))

        def active() -> bool:
            # the API server picks the configuration up asynchronously: wait for a refusal
            result = cluster.kubectl(
                "create", "--dry-run=server", "-f", "-", input=probe, check=False
            )
            return DENIED in result.stderr

        wait_for("the webhook configuration to take effect", active, 60, process)
        yield url, context
    finally:
        cluster.kubectl("delete", "validatingwebhookconfiguration", name, check=False)
        cluster.kubectl("delete", "mutatingwebhookconfiguration", name, check=False)
        cluster.kubectl("delete", "namespace", NS, "--wait=false", check=False)
        process.stop()
        print(f"[e2e] webhook log tail:\n{process.tail(15)}", flush=True)


def test_kubectl_apply_of_a_bad_job_is_refused_with_the_reason(
    cluster: Cluster, webhook: tuple[str, ssl.SSLContext]
) -> None:
    started = time.monotonic()
    bad = apply(cluster, job("bad-core", {MEM: 2, CORE: 33}))
    assert bad.returncode != 0, bad.stdout
    print(f"[e2e] kubectl apply of the bad Job:\n{bad.stderr}", flush=True)
    assert DENIED in bad.stderr
    assert "Job e2e-webhook/bad-core" in bad.stderr
    assert 'container "trainer" (spec.template.spec.containers[0])' in bad.stderr
    assert f"limits[\"{CORE}\"]='33' is not a multiple of 5" in bad.stderr
    assert "computing power is shared in steps of 5: use 5, 10, ... 100" in bad.stderr
    missing = cluster.kubectl("get", "job", "bad-core", "-n", NS, check=False)
    assert missing.returncode != 0  # nothing was stored

    good = apply(cluster, job("good-core", {MEM: 2, CORE: 30}))
    assert good.returncode == 0, good.stderr
    assert "job.batch/good-core created" in good.stdout
    assert "Warning:" not in good.stderr

    # the Job controller's pod passes the same webhook (Pod CREATE)
    def pod_created() -> bool:
        pods = cluster.kubectl_json("get", "pods", "-n", NS, "-l", "job-name=good-core")
        return bool(pods["items"])

    wait_for("the good Job's pod", pod_created, 60)
    print(f"[e2e] bad refused and good accepted in {time.monotonic() - started:.1f}s")


def nowhere_pod(name: str, limits: dict[str, Any], scheduler: str | None = None) -> dict[str, Any]:
    """A pod that no node will take (the test only looks at what admission stored)."""
    spec: dict[str, Any] = {
        "nodeSelector": {"gpushare-e2e": "webhook-nowhere"},
        "containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}],
    }
    if scheduler:
        spec["schedulerName"] = scheduler
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }


def stored_scheduler(cluster: Cluster, name: str) -> str:
    return str(cluster.kubectl_json("get", "pod", name, "-n", NS)["spec"]["schedulerName"])


def test_gpu_pod_without_the_scheduler_name_is_given_gpushares(
    cluster: Cluster, webhook: tuple[str, ssl.SSLContext]
) -> None:
    """The seeds' cuda-sample and friends name no scheduler; ACK users apply them unchanged."""
    result = apply(cluster, nowhere_pod("no-scheduler", {MEM: 3}))
    assert result.returncode == 0, result.stderr
    print(f"[e2e] kubectl apply of the pod without schedulerName:\n{result.stderr}", flush=True)
    assert "pod/no-scheduler created" in result.stdout
    # the API server defaults schedulerName before admission, so the webhook sees its value
    assert (
        f"Warning: Pod {NS}/no-scheduler: spec.schedulerName was 'default-scheduler'; gpushare "
        "set it to 'ack-co-scheduler'" in result.stderr
    )
    assert stored_scheduler(cluster, "no-scheduler") == "ack-co-scheduler"

    # a scheduler the user named is theirs: kept, with the validating webhook's warning
    named = apply(cluster, nowhere_pod("named", {MEM: 3}, scheduler="my-scheduler"))
    assert named.returncode == 0, named.stderr
    assert "Warning: spec.schedulerName is 'my-scheduler'" in named.stderr
    assert "set schedulerName: ack-co-scheduler" in named.stderr
    assert stored_scheduler(cluster, "named") == "my-scheduler"

    # a pod without GPU resources never reaches the webhook (matchConditions) and is kept
    cpu = apply(cluster, nowhere_pod("cpu-only", {"cpu": "100m"}))
    assert cpu.returncode == 0 and "Warning" not in cpu.stderr, cpu.stderr
    assert stored_scheduler(cluster, "cpu-only") == "default-scheduler"

    # a Job's template is left as written (with a note); the pods its controller makes are steered
    template = job("steered", {MEM: 2})
    del template["spec"]["template"]["spec"]["schedulerName"]
    created = apply(cluster, template)
    assert created.returncode == 0, created.stderr
    assert "gpushare's mutating webhook gives each of them schedulerName" in created.stderr

    def job_pod_scheduler() -> str:
        pods = cluster.kubectl_json("get", "pods", "-n", NS, "-l", "job-name=steered")["items"]
        return str(pods[0]["spec"]["schedulerName"]) if pods else ""

    wait_for("the steered Job's pod", lambda: job_pod_scheduler() == "ack-co-scheduler", 60)

    url, context = webhook
    with urllib.request.urlopen(f"{url}/metrics", context=context, timeout=5) as answer:
        metrics = answer.read().decode()
    assert 'gpushare_webhook_reviews_total{decision="mutated",kind="Pod"}' in metrics
    assert 'gpushare_webhook_reviews_total{decision="warned",kind="Pod"}' in metrics


def test_a_tenants_tampering_is_refused_on_create_and_update(
    cluster: Cluster, webhook: tuple[str, ssl.SSLContext]
) -> None:
    """The hostile pod of the multi-tenant review: forged allocation, ASSIGNED, nodeName and
    the isolation's own env. The admin identity of the test is not one of gpushare's trusted
    identities, so it is refused as a tenant would be."""
    forged = json.dumps(
        {
            "version": 1,
            "node": "gpushare-real-0",
            "unit": "1GiB",
            "gpus": [{"index": 0, "mem": 15, "core": 0}],
            "containers": [{"name": "main", "kind": "app", "gpus": [{"index": 0, "mem": 15}]}],
        }
    )
    hostile = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "hostile",
            "namespace": NS,
            "annotations": {
                "gpushare.io/allocation": forged,
                "ALIYUN_COM_GPU_MEM_ASSIGNED": "true",
            },
        },
        "spec": {
            "nodeName": "gpushare-real-0",
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "env": [
                        {"name": "LD_PRELOAD", "value": ""},
                        {"name": "GPUSHARE_MEM_LIMIT", "value": str(15 * 1024**3)},
                        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
                    ],
                    "resources": {"limits": {MEM: 1}},
                }
            ],
        },
    }
    refused = apply(cluster, hostile)
    print(f"[e2e] the hostile pod:\n{refused.stderr}", flush=True)
    assert refused.returncode != 0
    for field in (
        "gpushare.io/allocation",
        "ALIYUN_COM_GPU_MEM_ASSIGNED",
        "spec.nodeName",
        "LD_PRELOAD",
        "GPUSHARE_MEM_LIMIT",
        "NVIDIA_VISIBLE_DEVICES",
    ):
        assert field in refused.stderr, field
    assert cluster.kubectl("get", "pod", "hostile", "-n", NS, check=False).returncode != 0

    # an honest pod is admitted; writing the hand-off annotations on it afterwards is not
    honest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "honest", "namespace": NS},
        "spec": {
            "schedulerName": "ack-co-scheduler",
            "nodeSelector": {"gpushare-e2e": "webhook-nowhere"},
            "containers": [{"name": "main", "image": "busybox", "resources": {"limits": {MEM: 1}}}],
        },
    }
    assert apply(cluster, honest).returncode == 0
    annotate = cluster.kubectl(
        "annotate", "pod", "honest", "-n", NS, f"gpushare.io/allocation={forged}", check=False
    )
    print(f"[e2e] annotating the honest pod:\n{annotate.stderr}", flush=True)
    assert annotate.returncode != 0 and "gpushare.io/allocation" in annotate.stderr
    assigned = cluster.kubectl(
        "annotate", "pod", "honest", "-n", NS, "ALIYUN_COM_GPU_MEM_ASSIGNED=true", check=False
    )
    assert assigned.returncode != 0


def test_a_volume_over_the_cgpu_schedules_is_refused_in_a_pod_and_a_job(
    cluster: Cluster, webhook: tuple[str, ssl.SSLContext]
) -> None:
    """An emptyDir at /var/run/gpushare-sched (or /run/gpushare-sched, or below) would cover
    the plugin's read-only schedules with a directory the tenant writes its own slices into."""
    for name, path in (
        ("sched-var-run", "/var/run/gpushare-sched"),
        ("sched-run", "/run/gpushare-sched/x"),
    ):
        pod = nowhere_pod(name, {MEM: 1}, scheduler="ack-co-scheduler")
        pod["spec"]["volumes"] = [{"name": "sched", "emptyDir": {}}]
        pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "sched", "mountPath": path}]
        refused = apply(cluster, pod)
        print(f"[e2e] the pod with a volume at {path}:\n{refused.stderr}", flush=True)
        assert refused.returncode != 0 and DENIED in refused.stderr
        assert (
            f'container "main" (spec.containers[0].volumeMounts[0]): mountPath={path!r} is '
            f"refused on a pod that asks for {MEM}: the device plugin mounts the GPU isolation "
            f"at {path.removesuffix('/x')}"
        ) in refused.stderr
        assert "mount the volume elsewhere" in refused.stderr
        assert cluster.kubectl("get", "pod", name, "-n", NS, check=False).returncode != 0

    workload = job("sched-job", {MEM: 1})
    template = workload["spec"]["template"]["spec"]
    template["volumes"] = [{"name": "sched", "emptyDir": {}}]
    template["containers"][0]["volumeMounts"] = [
        {"name": "sched", "mountPath": "/var/run/gpushare-sched"}
    ]
    refused = apply(cluster, workload)
    assert refused.returncode != 0 and DENIED in refused.stderr, refused.stderr
    assert (
        'container "trainer" (spec.template.spec.containers[0].volumeMounts[0]): '
        "mountPath='/var/run/gpushare-sched' is refused"
    ) in refused.stderr
    assert cluster.kubectl("get", "job", "sched-job", "-n", NS, check=False).returncode != 0


def test_with_the_webhook_unreachable_only_gpu_objects_wait(
    cluster: Cluster, webhook: tuple[str, ssl.SSLContext]
) -> None:
    """Every replica down (here: the configuration pointed at a closed port): ordinary pods and
    Deployments are created as if the webhook were not installed; GPU objects, and pods that
    set NVIDIA_VISIBLE_DEVICES where the rule is in effect, wait for it (failurePolicy Fail).
    Before the matchConditions narrowing, the plain pod and Deployment were refused too."""
    url, _ = webhook
    name = CONFIGURATION_NAME  # what `gpushare webhook-config` printed and the fixture applied
    dead = f"https://127.0.0.1:{free_port()}/validate"

    def point(to: str) -> None:
        patch = [{"op": "replace", "path": "/webhooks/0/clientConfig/url", "value": to}]
        cluster.kubectl("patch", "validatingwebhookconfiguration", name, "--type=json",
                        "-p", json.dumps(patch))  # fmt: skip

    plain = nowhere_pod("plain", {})
    plain["spec"]["containers"][0]["resources"] = {}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "plain", "namespace": NS},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": "plain"}},
            "template": {
                "metadata": {"labels": {"app": "plain"}},
                "spec": {"containers": [{"name": "main", "image": "busybox"}]},
            },
        },
    }
    visible = nowhere_pod("visible", {})
    visible["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    point(dead)
    try:

        def refused_gpu() -> bool:  # the API server picks the change up asynchronously
            result = apply(cluster, job("gpu-while-down", {MEM: 2}))
            return result.returncode != 0 and "failed calling webhook" in result.stderr

        wait_for("the webhook to be unreachable", refused_gpu, 60)
        created = [apply(cluster, m) for m in (plain, deployment)]
        assert [r.returncode for r in created] == [0, 0], [r.stderr for r in created]
        result = apply(cluster, visible)
        assert result.returncode != 0 and "failed calling webhook" in result.stderr
    finally:
        point(f"{url}/validate")
        cluster.kubectl("delete", "pod", "plain", "-n", NS, "--wait=false", check=False)
        cluster.kubectl("delete", "deployment", "plain", "-n", NS, check=False)
