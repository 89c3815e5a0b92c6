"""``helm install`` of charts/gpushare into the real control plane.

What this shows: the API server accepts every object the chart renders (RBAC, the scheduler's
ConfigMap and Deployment, the device-plugin DaemonSet with system-node-critical priority and its
hostPaths, the webhook's Service, Deployment and both webhook configurations, the cert Job);
the DaemonSet controller places a device-plugin pod on a node labelled
``ack.node.gpu.schedule``; the chart's KubeSchedulerConfiguration is the one kube-scheduler runs
with here (the URL apart) and its ValidatingWebhookConfiguration the one test_webhook.py
registers (where to call apart); and an upgrade (a server-side dry run) that changes
``gpuMemoryUnit`` while a pod holds GPU memory is refused with the chart's message.

What it cannot show: nothing the chart starts runs. The nodes are kwok's, without kubelets and
without the image: pods the chart creates are either unscheduled or bound to a kwok node and
marked Running by kwok without executing anything, so the cert Job never writes its Secret and
the webhook never answers. The webhook configuration is therefore installed with
``failurePolicy: Ignore`` and scoped to namespaces carrying a label nobody has (the chart's
ValidatingAdmissionPolicy binding takes the same scope), so neither can get in the way of the
other tests, and the release is uninstalled at the end.
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.core.admitting.tampering import DEFAULT_EXEMPT_NAMESPACES
from gpushare.core.model.kubejson import name_of
from gpushare.core.model.names import ANN_NODE_UNIT
from gpushare.core.records.trust import SealKey, Trust, sort_node_pods
from gpushare.kube.sealing import key_from_secret
from gpushare.webhook.configuration import steering_configuration, webhook_configuration
from harness import previous_release
from harness.cluster import Cluster
from harness.realnode import RealNode, probe_env
from harness.seeding import kwok_node
from tests.support.e2e import CHART, create_nodes, delete_nodes, eventually, helm
from tests.support.realchart import (
    COMPONENTS,
    REAL_NAMESPACE,
    REAL_RELEASE,
    WEBHOOK_LABEL,
    chart_node,
)
from tests.support.realchart import allocatable as _allocatable
from tests.support.realchart import component_pods as _component_pods
from tests.support.realchart import helm_test_gpu_pod as _helm_test_gpu_pod
from tests.support.realchart import pod_ready as _ready
from tests.support.realchart import real_values as _real_values
from tests.support.realchart import restart_device_plugin as _restart_device_plugin
from tests.support.realchart import steered_job as _steered_job
from tests.support.realchart import wait_components as _wait_components
from tests.support.realchart import why_not as _why_not
from tests.support.realnode import NS as REAL_NS
from tests.support.realnode import (
    PROBE_THEN,
    expected,
    gpu_uuids,
    local_job,
    ns_pods,
)

RELEASE = "gpushare-e2e"


def without_client(webhook: dict[str, Any]) -> dict[str, Any]:
    """A webhook of a configuration, without clientConfig (URL here, Service in the chart)."""
    return {k: v for k, v in webhook.items() if k != "clientConfig"}


def stored_webhook(cluster: Cluster, configuration: dict[str, Any]) -> dict[str, Any]:
    """The configuration's webhook as the API server would store it (a server dry run)."""
    created = cluster.kubectl(
        "create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(configuration)
    )
    webhook: dict[str, Any] = json.loads(created.stdout)["webhooks"][0]
    return webhook


def semantic(config: dict[str, Any]) -> dict[str, Any]:
    """What must agree: profiles and extenders, without the URL (ports differ)."""
    extenders = [{k: v for k, v in e.items() if k != "urlPrefix"} for e in config["extenders"]]
    return {
        "apiVersion": config["apiVersion"],
        "kind": config["kind"],
        "profiles": config["profiles"],
        "extenders": extenders,
    }


@pytest.mark.e2e
def test_helm_install(cluster: Cluster) -> None:
    suffix = uuid.uuid4().hex[:6]
    namespace = f"gpushare-helm-{suffix}"
    node = f"helm-gpu-{suffix}"
    holder = "holds-gpu-mem"
    cluster.create_namespace(namespace)
    create_nodes(cluster, [kwok_node(node)])
    values = [
        "--set",
        "scheduler.defaultProfile=true",
        "--set",
        "webhook.failurePolicy=Ignore",
        "--set",
        "webhook.steer.failurePolicy=Ignore",
        "--set",
        f"webhook.namespaceLabels.gpushare\\.io/e2e-webhook={namespace}",
    ]
    try:
        helm(cluster, "install", RELEASE, str(CHART), "-n", namespace, "--wait=false", *values)
        assert "STATUS: deployed" in helm(cluster, "status", RELEASE, "-n", namespace).stdout

        # Every object the release holds exists in the API server.
        manifest = helm(cluster, "get", "manifest", RELEASE, "-n", namespace).stdout
        rendered = [d for d in yaml.safe_load_all(manifest) if d]
        got = json.loads(cluster.kubectl("get", "-f", "-", "-o", "json", input=manifest).stdout)[
            "items"
        ]
        assert sorted((d["kind"], d["metadata"]["name"]) for d in rendered) == sorted(
            (d["kind"], d["metadata"]["name"]) for d in got
        )
        kinds = {d["kind"] for d in got}
        assert {
            "Deployment",
            "DaemonSet",
            "Job",
            "ValidatingWebhookConfiguration",
            "MutatingWebhookConfiguration",
        } <= kinds

        webhook = cluster.kubectl_json(
            "get", "validatingwebhookconfiguration", f"{RELEASE}-webhook"
        )["webhooks"][0]
        assert webhook["failurePolicy"] == "Ignore"
        assert webhook["namespaceSelector"]["matchLabels"] == {"gpushare.io/e2e-webhook": namespace}
        # ... and it is what `gpushare webhook-config` gives test_webhook.py, both as the API
        # server stores them (defaults filled in), apart from where to call (URL vs Service).
        rendered_config = webhook_configuration(
            ca_bundle="",
            url="https://127.0.0.1:1/validate",
            failure_policy="Ignore",
            excluded_namespaces=["kube-system", namespace],
            namespace_labels={"gpushare.io/e2e-webhook": namespace},
            trusted_users=[
                f"system:serviceaccount:{namespace}:{RELEASE}-scheduler",
                f"system:serviceaccount:{namespace}:{RELEASE}-device-plugin",
            ],
            name=f"{RELEASE}-renderer",
            # the chart's defaults: auto beside cdi-cri refuses NVIDIA_VISIBLE_DEVICES from
            # unprivileged containers, so pods setting it are sent
            nvidia_visible_devices=True,
            nvidia_visible_devices_exempt=[namespace, *DEFAULT_EXEMPT_NAMESPACES],
        )
        assert without_client(webhook) == without_client(stored_webhook(cluster, rendered_config))
        # the steering configuration, the same way
        steering = cluster.kubectl_json(
            "get", "mutatingwebhookconfiguration", f"{RELEASE}-webhook"
        )["webhooks"][0]
        rendered_steering = steering_configuration(
            ca_bundle="",
            url="https://127.0.0.1:1/mutate",
            failure_policy="Ignore",
            excluded_namespaces=["kube-system", namespace],
            namespace_labels={"gpushare.io/e2e-webhook": namespace},
            name=f"{RELEASE}-renderer",
        )
        stored_steering = stored_webhook(cluster, rendered_steering)
        assert without_client(steering) == without_client(stored_steering)

        # The DaemonSet controller puts a device-plugin pod on the labelled node.
        def daemon_pods() -> list[str]:
            pods = cluster.kubectl_json(
                "get", "pods", "-n", namespace, "-l", "app.kubernetes.io/component=device-plugin"
            )["items"]
            return [p["spec"].get("nodeName") or "" for p in pods]

        assert node in eventually(lambda: node in daemon_pods() and daemon_pods(), 60, "DS pod")

        # The scheduler configuration is the one this control plane's kube-scheduler runs.
        configmap = cluster.kubectl_json(
            "get", "configmap", f"{RELEASE}-scheduler", "-n", namespace
        )
        chart_config = yaml.safe_load(configmap["data"]["scheduler-config.yaml"])
        harness_config = yaml.safe_load((cluster.root / "scheduler-config.yaml").read_text())
        assert semantic(chart_config) == semantic(harness_config)
        assert chart_config["leaderElection"] == {
            "leaderElect": True,
            "resourceLock": "leases",
            "resourceNamespace": namespace,
            "resourceName": f"{RELEASE}-scheduler",
        }

        # Changing the unit while a pod holds GPU memory on a 1GiB node is refused.
        assert (
            cluster.kubectl_json("get", "node", node)["metadata"]["annotations"][ANN_NODE_UNIT]
            == "1GiB"
        )
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": holder, "namespace": namespace},
            "spec": {
                "nodeName": node,
                "containers": [
                    {
                        "name": "main",
                        "image": "busybox:1.37",
                        "resources": {"limits": {"aliyun.com/gpu-mem": "3"}},
                    }
                ],
            },
        }
        cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))
        upgrade = [
            "upgrade",
            RELEASE,
            str(CHART),
            "-n",
            namespace,
            "--reuse-values",
            "--dry-run=server",
        ]
        refused = helm(cluster, *upgrade, "--set", "gpuMemoryUnit=128MiB", check=False)
        assert refused.returncode != 0
        assert "gpuMemoryUnit=128MiB refused: nodes publish gpuMemoryUnit=1GiB" in refused.stderr
        assert f"{namespace}/{holder} on {node}" in refused.stderr
        assert "--set gpuMemoryUnit=1GiB" in refused.stderr
        # The same unit passes, and so does the change once nothing holds memory.
        helm(cluster, *upgrade)
        cluster.kubectl(
            "delete", "pod", holder, "-n", namespace, "--grace-period=0", "--force", check=False
        )
        eventually(
            lambda: (
                holder not in cluster.kubectl("get", "pods", "-n", namespace, "-o", "name").stdout
            ),
            60,
            "holder pod gone",
        )
        helm(cluster, *upgrade, "--set", "gpuMemoryUnit=128MiB")
    finally:
        helm(cluster, "uninstall", RELEASE, "-n", namespace, "--wait=false", check=False)
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        delete_nodes(cluster, [node])
    assert (
        cluster.kubectl(
            "get", "validatingwebhookconfiguration", f"{RELEASE}-webhook", check=False
        ).returncode
        != 0
    )


# -- the chart on the real node ----------------------------------------------------------------


@pytest.fixture(scope="module")
def helm_node(cluster: Cluster) -> Iterator[tuple[RealNode, dict[str, str]]]:
    """The real node for the chart (``realchart.chart_node``), put back afterwards."""
    yield from chart_node(cluster)


@pytest.mark.e2e
def test_helm_install_runs_on_the_real_node(
    cluster: Cluster, helm_node: tuple[RealNode, dict[str, str]], tmp_path: Path
) -> None:
    node, images = helm_node
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(_real_values(cluster, node, images)))
    chart = ["-n", REAL_NAMESPACE, "-f", str(values)]
    cluster.create_namespace(REAL_NAMESPACE)
    cluster.kubectl(
        "delete", "namespace", REAL_NS, "--ignore-not-found", "--wait=true", timeout=180
    )
    cluster.create_namespace(REAL_NS)
    cluster.kubectl("label", "namespace", REAL_NS, f"{WEBHOOK_LABEL}={REAL_NS}")
    installed = False
    # installed as a user would, from the packaged chart `make release` ships (helm package)
    packaged = helm(cluster, "package", str(CHART), "-d", str(tmp_path)).stdout.strip()
    archive = packaged.rsplit(" ", 1)[-1]
    assert archive.endswith(".tgz") and Path(archive).is_file(), packaged
    try:
        started = time.monotonic()
        helm(cluster, "install", REAL_RELEASE, archive, *chart, "--wait=false")
        installed = True
        _wait_components(cluster, "scheduler, webhook and device plugin Ready, certs stored")
        print(f"[e2e] chart running in {time.monotonic() - started:.1f}s", flush=True)
        # what runs is the release recipe's image, under the name the chart gives by default
        ran = _running_images(cluster)
        assert ran == {images["gpushare"]}, ran
        # kube-scheduler won its Lease; the device plugin registered its fake GPUs with kubelet
        lease = cluster.kubectl_json(
            "get", "lease", "-n", REAL_NAMESPACE, f"{REAL_RELEASE}-scheduler"
        )
        # (on the host network the identity is the machine's hostname and a UUID)
        assert lease["spec"].get("holderIdentity") and lease["spec"].get("renewTime")
        eventually(lambda: _allocatable(node).get("aliyun.com/gpu-mem") == "60", 90, "60 GiB")
        webhook = cluster.kubectl_json(
            "get", "validatingwebhookconfiguration", f"{REAL_RELEASE}-webhook"
        )["webhooks"][0]
        assert webhook["clientConfig"].get("caBundle"), "the cert Job wrote the CA"
        uuids = gpu_uuids(cluster, node.name)

        # helm test's GPU pod: one unit through the chart's scheduler, and from inside, the
        # device node of its GPU (containerd applied the plugin's CDI name); the webhook test
        # needs a Service this node cannot route (no kube-proxy), so only the GPU pod runs.
        # The chart's plugin asked this node's containerd through the mounted CRI socket.
        plugin_log = cluster.kubectl(
            "logs", "-n", REAL_NAMESPACE, "-l", "app.kubernetes.io/component=device-plugin"
        ).stdout
        checked = [line for line in plugin_log.splitlines() if "phase=hand-off-check" in line]
        print(f"[e2e] the chart's device plugin: {checked}", flush=True)
        assert checked and "applied: containerd v2.2.9: enable_cdi = true" in checked[0]
        passed = _helm_test_gpu_pod(cluster)
        print(f"[e2e] helm test's GPU pod:\n{passed.stdout.partition('POD LOGS')[2]}", flush=True)
        assert "Phase:          Succeeded" in passed.stdout, passed.stdout + passed.stderr
        assert "ok   device nodes /dev/nvidia" in passed.stdout and "hand-off ok" in passed.stdout

        # GPUtest: placed by the chart's kube-scheduler and extender, served by its plugin.
        job = local_job("GPUtest.yaml", command=["/bin/sh", "-c", PROBE_THEN + "sleep 3600"])
        cluster.kubectl("apply", "-f", "-", input=json.dumps(job))

        def running() -> list[dict[str, Any]]:
            items = ns_pods(cluster, REAL_NS)
            return [p for p in items if p["status"].get("phase") == "Running"]

        items = eventually(running, 120, "GPUtest pod Running")
        name = items[0]["metadata"]["name"]
        env = eventually(
            lambda: probe_env(cluster.kubectl("logs", "-n", REAL_NS, name).stdout), 30, "logs"
        )
        assert env["ALIYUN_COM_GPU_MEM_CONTAINER"] == "3"
        assert env["ALIYUN_COM_GPU_MEM_DEV"] == "15"
        want = expected(items[0], "gpu-share-sample", uuids, node.device_list_strategy)
        assert {k: env.get(k) for k in want} == want

        # While it holds memory, an upgrade to another unit is refused, and nothing changes.
        upgrade = ["upgrade", REAL_RELEASE, str(CHART), *chart]
        refused = helm(cluster, *upgrade, "--set", "gpuMemoryUnit=128MiB", check=False)
        assert refused.returncode != 0
        assert "gpuMemoryUnit=128MiB refused: nodes publish gpuMemoryUnit=1GiB" in refused.stderr
        assert f"{REAL_NS}/{name} on {node.name}" in refused.stderr
        history = helm(cluster, "history", REAL_RELEASE, "-n", REAL_NAMESPACE, "-o", "json")
        assert [r["status"] for r in json.loads(history.stdout)] == ["deployed"]
        cluster.kubectl("delete", "job", "-n", REAL_NS, "gpu-share-sample", "--wait=true")
        eventually(lambda: not ns_pods(cluster, REAL_NS), 90, "GPUtest pod gone")

        # cuda-sample names no scheduler: the chart's webhook steers it; core_mem node.
        cluster.kubectl("label", "node", node.name, "ack.node.gpu.schedule=core_mem", "--overwrite")
        _restart_device_plugin(cluster)
        eventually(
            lambda: _allocatable(node).get("aliyun.com/gpu-core.percentage") == "400",
            90,
            "gpu-core.percentage 400",
        )
        env = _steered_job(cluster, "cuda-sample")
        assert env["ALIYUN_COM_GPU_MEM_CONTAINER"] == "2"
        assert env["GPUSHARE_CORE_LIMIT"] == "30"
        assert env["GPUSHARE_MEM_LIMIT"] == str(2 * 1024**3)
        assert "libgpushare-cuda.so" in env["PROBE_MAPPED"], env

        # tensorflow-mnist-share names no scheduler either: steered too, on the share node.
        cluster.kubectl("label", "node", node.name, "ack.node.gpu.schedule=share", "--overwrite")
        _restart_device_plugin(cluster)
        eventually(
            lambda: (
                "aliyun.com/gpu-core.percentage" not in _allocatable(node)
                or _allocatable(node)["aliyun.com/gpu-core.percentage"] == "0"
            ),
            90,
            "no computing power on the share node",
        )
        # (the old plugin's stop zeroes both resources at once: wait for the new one's memory)
        eventually(lambda: _allocatable(node).get("aliyun.com/gpu-mem") == "60", 90, "60 GiB")
        env = _steered_job(cluster, "tensorflow-mnist-share")
        assert env["ALIYUN_COM_GPU_MEM_CONTAINER"] == "4"
        assert env["ALIYUN_COM_GPU_MEM_DEV"] == "15"

        # Nothing holds memory: the upgrade to 128MiB passes and every component restarts in it.
        helm(cluster, *upgrade, "--set", "gpuMemoryUnit=128MiB")
        _restart_device_plugin(cluster)
        _wait_components(cluster, "the components Ready after the upgrade")
        eventually(lambda: _allocatable(node).get("aliyun.com/gpu-mem") == "480", 90, "480")
        manifest = local_job(
            "binpack-128mib.yaml", command=["/bin/sh", "-c", PROBE_THEN + "sleep 3600"]
        )
        cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))
        item = eventually(
            lambda: next((p for p in running() if p["metadata"]["name"] == "binpack-0"), None),
            120,
            "binpack-0 Running",
        )
        env = eventually(
            lambda: probe_env(cluster.kubectl("logs", "-n", REAL_NS, "binpack-0").stdout),
            30,
            "binpack-0 logs",
        )
        assert item["spec"]["schedulerName"] == "ack-co-scheduler"
        assert env["ALIYUN_COM_GPU_MEM_CONTAINER"] == "16"
        assert env["GPUSHARE_MEM_UNIT"] == "128MiB"
        cluster.kubectl("delete", "statefulset", "-n", REAL_NS, "binpack", "--wait=true")
        eventually(lambda: not ns_pods(cluster, REAL_NS), 90, "binpack-0 gone")

        # The shape of PLATFORMS.md gap 4 after the plugin started: containerd restarted with
        # enable_cdi = false. The running plugin cannot know (it checked at start); helm test's
        # GPU pod does, and fails naming the missing device node and the likely cause.
        node.enable_cdi = False
        node.start_containerd()
        try:
            failed = _helm_test_gpu_pod(cluster)
            print(f"[e2e] helm test on the CDI-off node:\n{failed.stdout}{failed.stderr}")
            assert failed.returncode != 0
            assert "FAIL 1 GPU device node(s) expected (/dev/nvidia" in failed.stdout
            assert "likely cause (cdi-cri)" in failed.stdout
        finally:
            node.enable_cdi = True
            node.start_containerd()
    except BaseException:
        print(_why_not(cluster), flush=True)
        raise
    finally:
        if installed:
            manifest_text = helm(
                cluster, "get", "manifest", REAL_RELEASE, "-n", REAL_NAMESPACE, check=False
            ).stdout
            helm(cluster, "uninstall", REAL_RELEASE, "-n", REAL_NAMESPACE, "--wait", check=False)
        cluster.kubectl("delete", "namespace", REAL_NS, "--wait=false", check=False)

    # Uninstall left nothing of the release behind; the seal key's Secret, made in the cluster
    # by the seal Job and not part of the release, stays (a reinstall keeps the key).
    rendered = [d for d in yaml.safe_load_all(manifest_text) if d]
    left = json.loads(
        cluster.kubectl(
            "get", "-f", "-", "-o", "json", "--ignore-not-found", input=manifest_text
        ).stdout
        or '{"items": []}'
    )["items"]
    assert len(rendered) > 20
    assert [(d["kind"], d["metadata"]["name"]) for d in left] == []
    assert not [
        d for d in rendered if d["kind"] == "Secret" and d["metadata"]["name"].endswith("-seal")
    ]
    seal = cluster.kubectl_json("get", "secret", f"{REAL_RELEASE}-seal", "-n", REAL_NAMESPACE)
    assert seal["metadata"]["labels"]["app.kubernetes.io/component"] == "seal"
    eventually(
        lambda: not cluster.kubectl_json("get", "pods", "-n", REAL_NAMESPACE)["items"],
        120,
        "the release's pods gone",
    )
    instance = f"app.kubernetes.io/instance={REAL_RELEASE}"
    for kind in (
        "all",
        "configmaps",
        "serviceaccounts",
        "roles",
        "rolebindings",
        "poddisruptionbudgets",
    ):
        got = cluster.kubectl("get", kind, "-n", REAL_NAMESPACE, "-l", instance, "-o", "name")
        assert not got.stdout.strip(), f"{kind} left behind: {got.stdout}"
    for kind in (
        "clusterroles",
        "clusterrolebindings",
        "validatingwebhookconfigurations",
        "mutatingwebhookconfigurations",
        "validatingadmissionpolicies",
        "validatingadmissionpolicybindings",
    ):
        got = cluster.kubectl("get", kind, "-l", instance, "-o", "name")
        assert not got.stdout.strip(), f"{kind} left behind: {got.stdout}"
    cluster.kubectl("delete", "namespace", REAL_NAMESPACE, "--wait=false", check=False)


@pytest.mark.e2e
def test_helm_template_applied_twice_by_kubectl_changes_nothing(
    cluster: Cluster, helm_node: tuple[RealNode, dict[str, str]], tmp_path: Path
) -> None:
    """GitOps (Argo CD, Flux in template mode): the chart rendered by `helm template` and
    applied with `kubectl apply`, then rendered and applied again. The second apply changes no
    object (no resourceVersion moves), the seal key the Job made is the same, a GPU pod placed
    before the second apply keeps running and its seal still verifies with the cluster's key
    (judged as the device plugin judges it), and the webhook still admits and steers. Before,
    every render held a new random seal key. Then a values change that reaches the certs Job
    is applied: no error, and the new Job runs to completion."""
    node, images = helm_node
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(_real_values(cluster, node, images)))
    version = cluster.kubectl_json("version")["serverVersion"]["gitVersion"]

    def render() -> str:
        out: str = helm(
            cluster, "template", REAL_RELEASE, str(CHART), "-n", REAL_NAMESPACE,
            "-f", str(values), "--kube-version", version, "--skip-tests",
        ).stdout  # fmt: skip
        return out

    def render_changed() -> str:
        out: str = helm(
            cluster, "template", REAL_RELEASE, str(CHART), "-n", REAL_NAMESPACE,
            "-f", str(values), "--kube-version", version, "--skip-tests",
            "--set", "webhook.certs.job.validityDays=3649",
        ).stdout  # fmt: skip
        return out

    first, second = render(), render()
    assert first == second  # the same objects, byte for byte
    before_jobs = {
        d["metadata"]["name"] for d in yaml.safe_load_all(first) if d and d["kind"] == "Job"
    }
    changed = ""
    # the install test above leaves the namespace terminating: wait for it to go
    cluster.kubectl(
        "delete", "namespace", REAL_NAMESPACE, "--ignore-not-found", "--wait=true", timeout=240
    )
    cluster.create_namespace(REAL_NAMESPACE)
    cluster.kubectl(
        "delete", "namespace", REAL_NS, "--ignore-not-found", "--wait=true", timeout=180
    )
    cluster.create_namespace(REAL_NS)
    cluster.kubectl("label", "namespace", REAL_NS, f"{WEBHOOK_LABEL}={REAL_NS}")
    apply = ["apply", "--server-side", "--field-manager=gitops", "-f", "-"]
    try:
        cluster.kubectl(*apply, input=first)
        _wait_components(cluster, "the applied chart Ready, seal and certs Jobs done")
        pod = _sealed_gpu_pod(cluster, node, "GPUtest Running")
        seal = cluster.kubectl_json("get", "secret", f"{REAL_RELEASE}-seal", "-n", REAL_NAMESPACE)
        docs = [d for d in yaml.safe_load_all(first) if d]

        def versions() -> dict[str, str]:
            """Each object's spec generation, or its resourceVersion where it has none (a
            workload's status moves its resourceVersion by itself, never its generation)."""
            got = json.loads(cluster.kubectl("get", "-f", "-", "-o", "json", input=first).stdout)
            return {
                f"{i['kind']}/{i['metadata']['name']}": str(
                    i["metadata"].get("generation") or i["metadata"]["resourceVersion"]
                )
                for i in got["items"]
            }

        before = versions()
        assert len(before) == len(docs)
        cluster.kubectl(*apply, input=second)
        time.sleep(2)
        assert versions() == before  # nothing changed
        again = cluster.kubectl_json("get", "secret", f"{REAL_RELEASE}-seal", "-n", REAL_NAMESPACE)
        assert again["data"] == seal["data"]  # the key stayed
        _wait_components(cluster, "the chart still Ready after the second apply")
        # the GPU pod untouched, its seal verifying; the webhook admitting and steering
        (still,) = ns_pods(cluster, REAL_NS)
        assert still["metadata"]["uid"] == pod["metadata"]["uid"]
        assert [c["restartCount"] for c in still["status"]["containerStatuses"]] == [0]
        assert _seals(cluster, node) == ([pod["metadata"]["name"]], [])
        assert _untrusted_warnings(cluster) == []
        assert _admitted(cluster) == (True, "")
        # A values change that reaches the certs Job: a new Job (its name is a hash of its
        # spec), applied without error and run to completion; before, the Job named after the
        # revision (always 1 here) refused it: "spec.template: ... field is immutable".
        changed = render_changed()
        cluster.kubectl(*apply, input=changed)
        (new_job,) = [
            d["metadata"]["name"]
            for d in yaml.safe_load_all(changed)
            if d and d["kind"] == "Job" and d["metadata"]["name"] not in before_jobs
        ]

        def succeeded() -> bool:
            job = cluster.kubectl_json("get", "job", new_job, "-n", REAL_NAMESPACE)
            return bool(job.get("status", {}).get("succeeded"))

        eventually(succeeded, 180, f"the changed certs Job {new_job} done")
        assert _admitted(cluster) == (True, "")
    finally:
        cluster.kubectl("delete", "namespace", REAL_NS, "--wait=true", check=False, timeout=180)
        if changed:
            cluster.kubectl("delete", "-f", "-", "--ignore-not-found", "--wait=true",
                            input=changed, check=False, timeout=240)  # fmt: skip
        cluster.kubectl("delete", "-f", "-", "--ignore-not-found", "--wait=true", input=first,
                        check=False, timeout=240)  # fmt: skip
        cluster.kubectl("delete", "secret", f"{REAL_RELEASE}-seal", "-n", REAL_NAMESPACE,
                        "--ignore-not-found", check=False)  # fmt: skip


# -- upgrades, renewals and scaling on the real node ---------------------------------------------


def _seals(cluster: Cluster, node: RealNode) -> tuple[list[str], list[str]]:
    """The workload namespace's GPU pods on the node judged as the device plugin judges them
    (``sort_node_pods``), with the key in the cluster's seal Secret: (trusted pod names,
    ignored pods with why)."""
    secret = cluster.kubectl_json("get", "secret", f"{REAL_RELEASE}-seal", "-n", REAL_NAMESPACE)
    key = key_from_secret(secret, where="the seal Secret")
    assert isinstance(key, SealKey), key
    judged = sort_node_pods(ns_pods(cluster, REAL_NS), node=node.name, trust=Trust.sealed(key))
    trusted = sorted(a.name for a in judged.allocations)
    ignored = sorted(f"{name_of(pod)}: {why.message}" for pod, why in judged.ignored)
    return trusted, ignored


def _sealed_gpu_pod(cluster: Cluster, node: RealNode, what: str) -> dict[str, Any]:
    """The GPUtest Job's pod Running (it sleeps), its seal verifying with the cluster's key."""
    eventually(lambda: _allocatable(node).get("aliyun.com/gpu-mem") == "60", 90, "60 GiB")
    job = local_job("GPUtest.yaml", command=["/bin/sh", "-c", PROBE_THEN + "sleep 3600"])
    cluster.kubectl("apply", "-f", "-", input=json.dumps(job))
    (pod,) = eventually(
        lambda: [p for p in ns_pods(cluster, REAL_NS) if p["status"].get("phase") == "Running"],
        120,
        what,
    )
    assert _seals(cluster, node) == ([pod["metadata"]["name"]], [])
    return dict(pod)


def _untrusted_warnings(cluster: Cluster) -> list[str]:
    """GPUShareUntrustedAllocation Events in the workload namespace (extender or plugin)."""
    items = cluster.kubectl_json(
        "get", "events", "-n", REAL_NS, "--field-selector=reason=GPUShareUntrustedAllocation"
    )["items"]
    return [f"{e['involvedObject']['name']}: {e.get('message', '')}" for e in items]


def _running_images(cluster: Cluster) -> set[str]:
    return {
        c["image"]
        for component in COMPONENTS
        for pod in _component_pods(cluster).get(component, [])
        for c in pod["spec"]["containers"]
        if c["name"] != "kube-scheduler"
    }


def _rolled_to(cluster: Cluster, image: str, what: str) -> None:
    """Every component's pods run ``image`` and are Ready, the Jobs complete."""

    def done() -> bool:
        return _running_images(cluster) == {image}

    eventually(done, 240, what)
    _wait_components(cluster, what)


def _admission_pod() -> dict[str, Any]:
    """A GPU pod naming no scheduler: both webhooks see it (the steering one names the
    scheduler), the validating one passes it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "admit-", "namespace": REAL_NS},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "busybox:1.37",
                    "resources": {"limits": {"aliyun.com/gpu-mem": "1"}},
                }
            ]
        },
    }


def _admitted(cluster: Cluster) -> tuple[bool, str]:
    """One admission through both webhooks (a server-side dry run): passed and steered?"""
    done = cluster.kubectl(
        "create", "--dry-run=server", "-o", "json", "-f", "-",
        input=json.dumps(_admission_pod()), check=False,
    )  # fmt: skip
    if done.returncode != 0:
        return False, done.stderr.strip()[-300:]
    steered = json.loads(done.stdout)["spec"].get("schedulerName") == "ack-co-scheduler"
    return steered, "" if steered else "not steered"


@dataclass
class Admissions:
    """Admissions made one after another in a thread while something else happens."""

    cluster: Cluster
    results: list[tuple[float, float, bool, str]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Admissions:
        def loop() -> None:
            while not self._stop.is_set():
                started = time.monotonic()
                ok, why = _admitted(self.cluster)
                self.results.append((started, time.monotonic(), ok, why))

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(60)

    def failed(self, since: float = 0.0) -> list[tuple[float, str]]:
        return [(s, why) for s, _, ok, why in self.results if not ok and s >= since]


def _new_certificate(work: Path, name: str) -> dict[str, bytes]:
    """A new CA and a serving certificate it signs for the webhook's Service names, as the
    cert Job or cert-manager would make them: {ca.crt, tls.crt, tls.key} in PEM."""
    service = f"{REAL_RELEASE}-webhook"
    names = [service, f"{service}.{REAL_NAMESPACE}", f"{service}.{REAL_NAMESPACE}.svc"]
    names.append(f"{names[-1]}.cluster.local")
    work.mkdir(parents=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=work, check=True, capture_output=True)

    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
            "-subj", f"/CN={name}")  # fmt: skip
    openssl("req", *ec, "-keyout", "tls.key", "-out", "tls.csr", "-subj", f"/CN={names[2]}")
    (work / "san.ext").write_text(
        "subjectAltName=" + ",".join(f"DNS:{n}" for n in names) + "\nextendedKeyUsage=serverAuth\n"
    )
    openssl("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-extfile", "san.ext", "-out", "tls.crt")  # fmt: skip
    return {n: (work / n).read_bytes() for n in ("ca.crt", "tls.crt", "tls.key")}


def _store_certificate(cluster: Cluster, files: dict[str, bytes]) -> None:
    """Replace the webhook's Secret (what the cert Job or cert-manager writes)."""
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"name": f"{REAL_RELEASE}-webhook-tls", "namespace": REAL_NAMESPACE},
        "data": {k: base64.b64encode(v).decode() for k, v in files.items()},
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(secret))


def _set_ca_bundle(cluster: Cluster, bundle: bytes) -> None:
    """caBundle of every webhook of both configurations (cert-manager's CA injector)."""
    encoded = base64.b64encode(bundle).decode()
    for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
        name = f"{REAL_RELEASE}-webhook"
        count = len(cluster.kubectl_json("get", kind, name)["webhooks"])
        patch = [
            {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": encoded}
            for i in range(count)
        ]
        cluster.kubectl("patch", kind, name, "--type=json", "-p", json.dumps(patch))


def _served_certificate(cluster: Cluster) -> bytes:
    """The certificate (DER) the webhook pod serves now, from a TLS handshake with it; empty
    when the handshake fails."""
    (pod,) = _component_pods(cluster)["webhook"]
    address = (pod["status"]["podIP"], 9443)
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection(address, timeout=5) as raw, context.wrap_socket(raw) as tls:
            der = tls.getpeercert(binary_form=True)
    except OSError:
        return b""
    return der or b""


def _der(pem: bytes) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pem.decode())


def _renew(
    cluster: Cluster, files: dict[str, bytes], old_ca: bytes, *, overlap: bool
) -> tuple[float, float]:
    """Renew the webhook's certificate with a new CA while admissions go on; return when the
    Secret changed (monotonic) and how long after that the webhook served the new certificate.

    ``overlap=False`` is what cert-manager's CA injector does: the Secret and caBundle change
    together, so until kubelet refreshes the mounted files and the webhook reloads them the
    API server trusts only a CA the webhook does not serve yet. ``overlap=True`` is the order
    that loses nothing: caBundle holds both CAs while the files change, the old CA is dropped
    once the new certificate is served."""
    if overlap:
        _set_ca_bundle(cluster, old_ca + files["ca.crt"])
        time.sleep(3)  # the API server's configuration informer
    started = time.monotonic()
    _store_certificate(cluster, files)
    if not overlap:
        _set_ca_bundle(cluster, files["ca.crt"])
    want = _der(files["tls.crt"])
    eventually(lambda: _served_certificate(cluster) == want, 240, "the new certificate served")
    served = time.monotonic() - started
    if overlap:
        _set_ca_bundle(cluster, files["ca.crt"])
    time.sleep(8)  # admissions go on with the new certificate alone
    return started, served


@pytest.mark.e2e
def test_helm_upgrade_from_the_previous_release_keeps_gpu_pods(
    cluster: Cluster, helm_node: tuple[RealNode, dict[str, str]], tmp_path: Path
) -> None:
    """The previous release (0.1.0, rebuilt from its commit by previous_release.py: its packaged
    chart and its image) installed on the real node with a GPU pod running; its CRDs applied
    as docs/helm.md says, then `helm upgrade` to the working chart (packaged, the working
    image). The GPU pod keeps running untouched, its seal verifies with the cluster's key as the
    device plugin judges it, nothing reports an untrusted allocation, and a new GPU pod is
    steered, placed and served by the upgraded components.

    Then, on the upgraded release: the webhook's certificate renewed with a new CA while
    admissions go on, first as cert-manager does (Secret and caBundle at once: the failures
    until the files refresh are counted, none after), then with the CAs overlapping (none at
    all), timing how long until the new certificate is served; and ``kubectl scale`` of the
    webhook to 3 followed by a ``helm upgrade``."""
    node, images = helm_node
    previous = previous_release.build(str(cluster.binaries["helm"]), progress=True)
    node.ctr("images", "import", str(previous.image), timeout=300)
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(_real_values(cluster, node, images)))
    chart = ["-n", REAL_NAMESPACE, "-f", str(values)]
    # the previous release's schema refuses keys added since: it gets the values it knew
    previous_values = tmp_path / "previous-values.yaml"
    previous_values.write_text(
        yaml.safe_dump(previous.fit_values(_real_values(cluster, node, images)))
    )
    for namespace in (REAL_NAMESPACE, REAL_NS):  # an earlier test's may still be going
        cluster.kubectl(
            "delete", "namespace", namespace, "--ignore-not-found", "--wait=true", timeout=240
        )
        cluster.create_namespace(namespace)
    cluster.kubectl("label", "namespace", REAL_NS, f"{WEBHOOK_LABEL}={REAL_NS}")
    packaged = helm(cluster, "package", str(CHART), "-d", str(tmp_path)).stdout.strip()
    working = packaged.rsplit(" ", 1)[-1]
    installed = False
    try:
        helm(
            cluster,
            "install",
            REAL_RELEASE,
            str(previous.chart),
            "-n",
            REAL_NAMESPACE,
            "-f",
            str(previous_values),
            "--wait=false",
        )
        installed = True
        _rolled_to(cluster, previous.image_name, "the previous release Ready")
        pod = _sealed_gpu_pod(cluster, node, "GPUtest Running under the previous release")
        name = pod["metadata"]["name"]
        annotations = pod["metadata"]["annotations"]

        # CRDs: Helm upgrades none; docs/helm.md says to apply the chart's before upgrading
        crds = sorted((CHART / "crds").glob("*.yaml"))
        for crd in crds:
            cluster.kubectl("apply", "--server-side", "-f", str(crd))
        started = time.monotonic()
        helm(cluster, "upgrade", REAL_RELEASE, working, *chart, "--wait=false")
        _rolled_to(cluster, images["gpushare"], "the upgraded release Ready")
        print(f"[e2e] upgrade rolled out in {time.monotonic() - started:.1f}s", flush=True)
        history = json.loads(
            helm(cluster, "history", REAL_RELEASE, "-n", REAL_NAMESPACE, "-o", "json").stdout
        )
        assert [(r["chart"], r["status"]) for r in history] == [
            (f"gpushare-{previous.release.version}", "superseded"),
            (
                f"gpushare-{yaml.safe_load((CHART / 'Chart.yaml').read_text())['version']}",
                "deployed",
            ),
        ]
        for crd in crds:
            document = yaml.safe_load(crd.read_text())
            stored = cluster.kubectl_json("get", "crd", document["metadata"]["name"])
            assert [v["name"] for v in stored["spec"]["versions"]] == [
                v["name"] for v in document["spec"]["versions"]
            ]

        # The GPU pod: the same pod, never restarted, its allocation and seal unchanged and
        # still verifying; the upgraded device plugin and extender trust it.
        (after,) = ns_pods(cluster, REAL_NS)
        assert after["metadata"]["uid"] == pod["metadata"]["uid"]
        assert after["status"]["phase"] == "Running"
        assert [c["restartCount"] for c in after["status"]["containerStatuses"]] == [0]
        for key in ("gpushare.io/allocation", "gpushare.io/seal"):
            assert after["metadata"]["annotations"][key] == annotations[key]
        assert _seals(cluster, node) == ([name], [])
        assert _untrusted_warnings(cluster) == []

        # A new GPU pod after the upgrade: steered by the new webhook, placed and served.
        env = _steered_job(cluster, "tensorflow-mnist-share")
        assert env["ALIYUN_COM_GPU_MEM_CONTAINER"] == "4"
        assert _seals(cluster, node) == ([name], [])
        assert _untrusted_warnings(cluster) == []

        # Certificate renewal with a new CA, admissions going on.
        secret = cluster.kubectl_json(
            "get", "secret", f"{REAL_RELEASE}-webhook-tls", "-n", REAL_NAMESPACE
        )
        old_ca = base64.b64decode(secret["data"]["ca.crt"])
        assert _admitted(cluster) == (True, "")
        renewed = _new_certificate(tmp_path / "ca-2", "renewed-2")
        with Admissions(cluster) as naive:
            naive_changed, naive_served = _renew(cluster, renewed, old_ca, overlap=False)
        overlapped = _new_certificate(tmp_path / "ca-3", "renewed-3")
        with Admissions(cluster) as safe:
            safe_changed, safe_served = _renew(cluster, overlapped, renewed["ca.crt"], overlap=True)
        for label, run, changed, served in (
            ("together (cert-manager)", naive, naive_changed, naive_served),
            ("overlapping", safe, safe_changed, safe_served),
        ):
            failed = [round(s - changed, 1) for s, _ in run.failed()]
            print(
                f"[e2e] certificate renewal, caBundle and Secret {label}: new certificate served "
                f"{served:.1f}s after the Secret changed; {len(run.results)} admissions, "
                f"{len(failed)} failed (at {failed[:1]}..{failed[-1:]} s)",
                flush=True,
            )
        # as cert-manager does it: failures only until the webhook serves the new certificate
        late = naive.failed(since=naive_changed + naive_served)
        assert late == [], late
        assert [r for r in naive.results if r[0] > naive_changed + naive_served and r[2]]
        # with the CAs overlapping: none at all
        assert len(safe.results) > 10 and safe.failed() == [], safe.failed()

        # kubectl scale of the webhook takes effect until the chart next renders replicas.
        deployment = f"{REAL_RELEASE}-webhook"
        cluster.kubectl("scale", "deployment", deployment, "-n", REAL_NAMESPACE, "--replicas=3")

        def webhooks_ready() -> int:
            return sum(_ready(p) for p in _component_pods(cluster).get("webhook", []))

        eventually(lambda: webhooks_ready() == 3, 120, "3 webhook replicas Ready")
        helm(cluster, "upgrade", REAL_RELEASE, working, *chart, "--wait=false")
        eventually(
            lambda: (
                cluster.kubectl_json("get", "deployment", deployment, "-n", REAL_NAMESPACE)["spec"][
                    "replicas"
                ]
                == 1
            ),
            60,
            "helm upgrade sets replicas back to webhook.replicas",
        )
    except BaseException:
        print(_why_not(cluster), flush=True)
        raise
    finally:
        cluster.kubectl("delete", "namespace", REAL_NS, "--wait=true", check=False, timeout=180)
        if installed:
            helm(cluster, "uninstall", REAL_RELEASE, "-n", REAL_NAMESPACE, "--wait", check=False)
        cluster.kubectl(
            "delete", "namespace", REAL_NAMESPACE, "--wait=true", check=False, timeout=240
        )
