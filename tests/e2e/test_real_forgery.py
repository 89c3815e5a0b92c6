"""Issue 14 on the real node: no pod gets more GPU than it asked for.

``tests/integration/deviceplugin/test_forgery.py`` proves these findings on in-memory doubles (a
fake kubelet that calls ``Allocate`` when told to). Here the same tenant moves meet the real thing:
kube-apiserver, kube-scheduler with the extender, a real kubelet with containerd, and the device
plugin process registered with that kubelet. A tenant may create pods in their own namespace
with any annotations, any ``schedulerName`` and ``spec.nodeName`` set (which skips the
scheduler); the forged records are written the way gpushare spells them
(``core.records.allocation.to_annotations``), only without the seal that the extender adds at bind.

What each test reads is what a person would: ``kubectl inspect cgpu`` (the installed plugin,
with the seal key from the Secret the chart creates), the pods' phase and status message as
kubelet wrote them, the extender's ``/metrics``, Events, and the environment each container's
``/probe`` printed into its termination message.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpushare.core.model.containers import ContainerKind
from gpushare.core.model.gpumodel import LABEL_COUNT, LABEL_MEM, LABEL_MODEL
from gpushare.core.model.names import (
    ANN_ALLOCATION,
    ANN_ASSIGNED,
    ANN_NODE_GPUS,
    ANN_NODE_TOPOLOGY,
    ANN_SEAL,
)
from gpushare.core.model.topology import layout, topology_annotation
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.allocation import Allocation, ContainerShare, GpuShare, to_annotations
from gpushare.kube.lightkube_api import LightkubeAPI
from gpushare.kube.port import KubeError
from harness import identities
from harness.cluster import Cluster
from harness.identities import token_kubeconfig
from harness.realnode import NODE_NAME, RealNode, container, hand_off, pod, probe_env
from harness.seeding import kwok_node
from tests.support.e2e import create_nodes, delete_nodes, eventually

NS = "e2e-forgery"
GPUS = 4
GPU_UNITS = 15
"""The real node runs ``--fake-gpus 4x15GiB`` (RealNode's default)."""
SEAL_NAMESPACE, SEAL_SECRET = "gpushare", "gpushare-seal"
"""Where ``kubectl inspect cgpu`` looks for the key by default (the chart's Secret)."""


# -- the cluster as a person sees it ---------------------------------------------------------


def get_pod(cluster: Cluster, name: str) -> dict[str, Any]:
    found: dict[str, Any] = cluster.kubectl_json("get", "pod", "-n", NS, name)
    return found


def annotation(item: dict[str, Any], key: str) -> str:
    return str((item["metadata"].get("annotations") or {}).get(key, ""))


def inspect(cluster: Cluster, *args: str) -> tuple[str, str]:
    """``kubectl inspect cgpu ARGS``: kubectl finds gpushare's plugin on PATH; (stdout, stderr)."""
    result = cluster.kubectl("inspect", "cgpu", *args)
    return result.stdout, result.stderr


def real_gpus(view: dict[str, Any]) -> list[tuple[int, int]]:
    """(allocated, total) units of each GPU of the real node in ``inspect -o json``."""
    (node,) = [n for n in view["nodes"] if n["name"] == NODE_NAME]
    return [(g["allocatedUnits"], g["totalUnits"]) for g in node["gpus"]]


def extender_counter(cluster: Cluster, name: str, labels: dict[str, str]) -> float:
    """One sample of the extender's ``/metrics`` (0 before it is first counted)."""
    with urllib.request.urlopen(f"{cluster.extender_url}/metrics", timeout=5) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return 0.0


def events_about(cluster: Cluster, name: str, reason: str) -> list[dict[str, Any]]:
    selector = f"involvedObject.name={name},reason={reason}"
    items: list[dict[str, Any]] = cluster.kubectl_json(
        "get", "events", "-n", NS, f"--field-selector={selector}"
    )["items"]
    return items


def plugin_log(cluster: Cluster) -> str:
    return (cluster.root / "logs" / "gpushare-device-plugin.log").read_text(errors="replace")


def probed(item: dict[str, Any], name: str) -> dict[str, str]:
    """What ``/probe`` printed in a finished container (its termination message)."""
    for entry in item["status"].get("containerStatuses") or []:
        message = ((entry.get("state") or {}).get("terminated") or {}).get("message")
        if entry["name"] == name and message:
            return probe_env(message)
    return {}


def started(item: dict[str, Any]) -> bool:
    """Whether any container of the pod is running or has run."""
    for entry in item["status"].get("containerStatuses") or []:
        state = entry.get("state") or {}
        if "running" in state or "terminated" in state:
            return True
    return False


def gpu_uuids(cluster: Cluster) -> dict[int, str]:
    node = cluster.kubectl_json("get", "node", NODE_NAME)
    return {
        g["index"]: g["uuid"] for g in json.loads(node["metadata"]["annotations"][ANN_NODE_GPUS])
    }


def held_gpus(item: dict[str, Any]) -> dict[int, int]:
    """GPU index -> units in the pod's (sealed) allocation record."""
    record = json.loads(annotation(item, ANN_ALLOCATION))
    return {g["index"]: g["mem"] for g in record["gpus"]}


def forge(
    manifest: dict[str, Any], *, gpus: list[tuple[int, int]], container_name: str
) -> dict[str, Any]:
    """The manifest with a hand-written allocation on the real node: ``gpus`` is [(index, units)].

    Written as ``tests/integration/deviceplugin/test_forgery.py`` writes it, by gpushare's own
    serializer, so only the missing seal tells it apart from the extender's.
    """
    shares = tuple(GpuShare(index=i, mem_units=m) for i, m in gpus)
    allocation = Allocation(
        uid="",
        namespace=NS,
        name=manifest["metadata"]["name"],
        node=NODE_NAME,
        unit=MemoryUnit.GiB,
        gpus=shares,
        containers=(ContainerShare(name=container_name, kind=ContainerKind.APP, gpus=shares),),
    )
    manifest["metadata"]["annotations"] = to_annotations(allocation, dev_units=GPU_UNITS)
    return manifest


def with_node_name(manifest: dict[str, Any]) -> dict[str, Any]:
    """The pod bound by its author (``spec.nodeName``), as no scheduler would place it."""
    spec = manifest["spec"]
    spec.pop("schedulerName")
    spec.pop("nodeSelector")
    spec["nodeName"] = NODE_NAME
    return manifest


def create(cluster: Cluster, manifest: dict[str, Any]) -> None:
    cluster.kubectl("create", "-f", "-", input=json.dumps(manifest))


@contextlib.contextmanager
def kubelet_paused(node: RealNode) -> Iterator[None]:
    """kubelet stopped (SIGSTOP) for the block, continued after it whatever happens.

    Stopped, it reads nothing from the API, so pods bound meanwhile wait to be admitted; nor
    does it renew its lease, but a block of a few seconds stays well inside the node monitor's
    grace period (50 s by default in v1.36), so the node stays Ready and schedulable.
    """
    pid = node.processes["kubelet"].pid
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture
def ns(real_node: RealNode) -> Iterator[str]:
    """A fresh namespace, deleted and waited for afterwards: the next test finds no GPU held."""
    cluster = real_node.cluster
    cluster.kubectl("delete", "namespace", NS, "--ignore-not-found", "--wait=true", timeout=180)
    cluster.create_namespace(NS)
    yield NS
    cluster.kubectl(
        "delete", "namespace", NS, "--ignore-not-found", "--wait=true", timeout=180, check=False
    )


@pytest.fixture(scope="module")
def seal_secret(real_node: RealNode) -> Iterator[None]:
    """The chart's Secret ``gpushare/gpushare-seal`` holding the key the extender and the
    device plugin use, so ``kubectl inspect cgpu`` checks seals exactly as they do."""
    cluster = real_node.cluster
    made = cluster.create_namespace(SEAL_NAMESPACE, check=False)
    cluster.kubectl(
        "create",
        "secret",
        "generic",
        SEAL_SECRET,
        "-n",
        SEAL_NAMESPACE,
        f"--from-file=key={cluster.seal_key}",
    )
    yield
    if made:
        cluster.kubectl("delete", "namespace", SEAL_NAMESPACE, "--wait=false", check=False)
    else:
        cluster.kubectl("delete", "secret", SEAL_SECRET, "-n", SEAL_NAMESPACE, check=False)


# -- finding 1 --------------------------------------------------------------------------------


def test_finding_1_a_forged_allocation_fills_no_gpu_on_the_real_node(
    real_node: RealNode, ns: str, seal_secret: None
) -> None:
    """Finding 1: a forged allocation held every GPU of a node.

    The tenant created a pod asking for no GPU, with ``schedulerName: nobody`` so that it is
    never scheduled, carrying a hand-written ``gpushare.io/allocation`` that names the real node
    and all four of its GPUs, full. Read at face value that record filled the node and kept
    everyone's GPU pods Pending. Now the record carries no seal, so ``kubectl inspect cgpu``
    counts nothing for it and lists it as ignored, the extender counts it once
    (``gpushare_untrusted_allocations_total{reason="no_seal"}``) and says so on the pod with a
    Warning Event, and a 1 GiB pod is placed on the real node and runs there.
    """
    cluster = real_node.cluster
    counter = ("gpushare_untrusted_allocations_total", {"reason": "no_seal"})
    before = extender_counter(cluster, *counter)
    squatter = forge(
        pod("squatter", NS, [container("main", command="sleep 3600")]),
        gpus=[(i, GPU_UNITS) for i in range(GPUS)],
        container_name="main",
    )
    squatter["spec"]["schedulerName"] = "nobody"
    create(cluster, squatter)
    eventually(
        lambda: events_about(cluster, "squatter", "GPUShareUntrustedAllocation"),
        30,
        "the extender's Warning Event on the squatter",
    )

    text, note = inspect(cluster)
    print(text)
    assert not note, note  # the key came from the Secret: seals were checked
    view = json.loads(inspect(cluster, "-o", "json")[0])
    assert real_gpus(view) == [(0, GPU_UNITS)] * GPUS
    ignored = [i for i in view["ignored"] if i["namespace"] == NS]
    assert [(i["name"], i["node"], i["reason"]) for i in ignored] == [
        ("squatter", NODE_NAME, "no seal")
    ]
    assert f"{NS}/squatter names node {NODE_NAME}: no seal" in text

    small = pod("small", NS, [container("c0", 1)])
    create(cluster, small)
    done = eventually(
        lambda: (item := get_pod(cluster, "small"))["status"].get("phase") == "Succeeded" and item,
        90,
        "the 1 GiB pod Succeeded on the real node",
    )
    assert done["spec"]["nodeName"] == NODE_NAME
    assert annotation(done, ANN_SEAL).startswith("v1.")
    assert probed(done, "c0")["ALIYUN_COM_GPU_MEM_CONTAINER"] == "1"

    warnings = events_about(cluster, "squatter", "GPUShareUntrustedAllocation")
    assert len(warnings) == 1 and warnings[0]["type"] == "Warning", warnings
    assert "no seal" in warnings[0]["message"]
    assert extender_counter(cluster, *counter) - before == 1  # once, though seen many times
    assert get_pod(cluster, "squatter")["status"].get("phase") == "Pending"


# -- finding 2 --------------------------------------------------------------------------------


def test_finding_2_a_nodename_pod_with_a_forged_allocation_is_refused_by_kubelet(
    real_node: RealNode, ns: str, seal_secret: None
) -> None:
    """Finding 2: over-commit through ``spec.nodeName``.

    One GPU of the real node is full with a 15 GiB pod gpushare placed. The tenant created a
    pod with ``spec.nodeName`` set to that node (no scheduler, so no filter), asking for 8 GiB
    and carrying a forged allocation naming the full GPU. kubelet has 45 free devices, so it
    admits the pod and calls the device plugin's ``Allocate``, which served the forged record
    before: 23 GiB of a 15 GiB GPU. Now the plugin trusts only sealed records and refuses the
    call, naming the pod; kubelet fails the pod at admission, it is never marked served, no
    container of it starts, and ``kubectl inspect cgpu`` shows that GPU at 15/15, both while
    the pod waits for kubelet (its 8 GiB count on the node as a whole) and after.
    """
    cluster = real_node.cluster
    create(cluster, pod("full", NS, [container("c0", GPU_UNITS, command="sleep 3600")]))
    full = eventually(
        lambda: annotation(item := get_pod(cluster, "full"), ANN_ASSIGNED) == "true" and item,
        90,
        "the 15 GiB pod served by the device plugin",
    )
    ((gpu, units),) = held_gpus(full).items()
    assert units == GPU_UNITS

    log_from = len(plugin_log(cluster))
    intruder = forge(
        with_node_name(pod("overcommit", NS, [container("c0", 8, command="sleep 3600")])),
        gpus=[(gpu, 8)],
        container_name="c0",
    )
    with kubelet_paused(real_node):  # bound and live, before kubelet admits it
        create(cluster, intruder)
        view = json.loads(inspect(cluster, "-o", "json")[0])
    (node,) = [n for n in view["nodes"] if n["name"] == NODE_NAME]
    assert real_gpus(view)[gpu] == (GPU_UNITS, GPU_UNITS)
    assert node["pendingUnits"] == 8  # on the node as a whole, never on the full GPU
    assert ("overcommit", "no seal") in [(i["name"], i["reason"]) for i in view["ignored"]]
    seen: list[dict[str, Any]] = []

    def failed() -> dict[str, Any] | None:
        item = get_pod(cluster, "overcommit")
        seen.append(item)
        return item if item["status"].get("phase") == "Failed" else None

    refused = eventually(failed, 60, "kubelet to fail the nodeName pod")
    status = refused["status"]
    print(f"kubelet: {status.get('reason')}: {status.get('message')}")
    # kubelet's admission turns the plugin's refusal into this reason (pkg/kubelet/lifecycle)
    assert status.get("reason") == "UnexpectedAdmissionError", status
    assert f"pod {NS}/overcommit (its allocation is ignored: no seal)" in status["message"]
    assert "was not placed by gpushare" in status["message"]
    assert not any(started(item) for item in seen)
    # the served-checks run every second: give them a few, then the pod must still not be served
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        seen.append(get_pod(cluster, "overcommit"))
        time.sleep(0.5)
    assert all(annotation(item, ANN_ASSIGNED) != "true" for item in seen)

    gpus = real_gpus(json.loads(inspect(cluster, "-o", "json")[0]))
    assert gpus[gpu] == (GPU_UNITS, GPU_UNITS), gpus
    assert all(allocated <= total for allocated, total in gpus)
    log = plugin_log(cluster)[log_from:]
    assert f"pod={NS}/overcommit phase=trust allocation ignored: no seal" in log
    assert "phase=allocate refused" in log
    assert get_pod(cluster, "full")["status"]["phase"] == "Running"


# -- finding 3 --------------------------------------------------------------------------------


def created_second(item: dict[str, Any]) -> float:
    stamp = item["metadata"]["creationTimestamp"].replace("Z", "+00:00")
    return datetime.fromisoformat(stamp).timestamp()


def victim_job(name: str) -> dict[str, Any]:
    """A Job of one 5 GiB pod placed by gpushare: its controller replaces a pod kubelet fails."""
    spec = pod(name, NS, [container("c0", 5, command="sleep 2")])["spec"]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"backoffLimit": 3, "template": {"spec": spec}},
    }


def test_finding_3_a_nodename_pod_never_takes_a_waiting_pods_answer(
    real_node: RealNode, ns: str, seal_secret: None
) -> None:
    """Finding 3: a ``nodeName`` pod took the answer meant for a pod gpushare placed.

    kubelet's ``Allocate`` names device IDs, never the pod. A 5 GiB pod gpushare placed was
    bound and waiting for kubelet when the tenant's 5 GiB pod, created with ``spec.nodeName``
    and no allocation, was admitted first; the plugin answered with the waiting pod's GPU.
    Here kubelet is paused (SIGSTOP) while both reach the node, the tenant's pod created first:
    kubelet admits pods sorted by creation time (``HandlePodAdditions`` in pkg/kubelet/kubelet.go
    of k8s.io/kubernetes v1.36.3: ``sort.Sort(sliceutils.PodsByCreationTime(pods))``), and
    when they arrive in two batches the older one's event comes first.

    Now the plugin refuses the tenant's call, naming both pods; kubelet fails the tenant's pod
    and none of its containers start. The real kubelet then admits the waiting pod 7 to 80 ms
    later, before its status manager has published the tenant's pod as Failed; the plugin holds
    that refusal back until it sees the tenant's pod Failed (deviceplugin/allocating.py), so the
    waiting pod gets its own answer on its first try: the Job never needs a second pod. (Before
    that wait, 4 runs in 6 refused the waiting pod too.)
    """
    cluster = real_node.cluster
    intruder = with_node_name(pod("intruder", NS, [container("c0", 5, command="sleep 3600")]))

    def victims() -> list[dict[str, Any]]:
        listed = cluster.kubectl_json("get", "pods", "-n", NS, "-l", "job-name=victim")
        return sorted(listed["items"], key=lambda p: p["metadata"]["creationTimestamp"])

    with kubelet_paused(real_node):
        create(cluster, intruder)
        older = created_second(get_pod(cluster, "intruder"))
        # creationTimestamp counts whole seconds: make the victim strictly younger
        while time.time() < older + 1.05:
            time.sleep(0.05)
        create(cluster, victim_job("victim"))
        (first,) = eventually(
            lambda: [
                p
                for p in victims()
                if annotation(p, ANN_SEAL) and p["spec"].get("nodeName") == NODE_NAME
            ],
            30,
            "the victim's pod bound with a sealed allocation while kubelet is paused",
        )
        assert created_second(first) > older
        assert not first["status"].get("containerStatuses")

    uuids = gpu_uuids(cluster)
    running_together: list[str] = []

    def settled() -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        one, others = get_pod(cluster, "intruder"), victims()
        for other in others:
            if started(one) and started(other):
                running_together.append(other["metadata"]["name"])
        done = any(p["status"].get("phase") == "Succeeded" for p in others)
        return (one, others) if one["status"].get("phase") == "Failed" and done else None

    one, others = eventually(settled, 90, "kubelet to refuse the intruder and the Job to finish")
    print(f"intruder: {one['status'].get('reason')}: {one['status'].get('message')}")
    for other in others:
        print(f"victim {other['metadata']['name']}: {other['status'].get('phase')}")
    assert not running_together, running_together
    assert not started(one)
    first_name = first["metadata"]["name"]
    message = one["status"]["message"]
    assert one["status"]["reason"] == "UnexpectedAdmissionError"
    assert f"pod {NS}/intruder (it carries no gpushare allocation)" in message
    assert f"{NS}/{first_name}, which gpushare placed" in message

    assert [p["metadata"]["name"] for p in others] == [first_name]  # served on the first try
    for other in others:
        status = other["status"]
        assert status["phase"] == "Succeeded", status
        ((gpu, units),) = held_gpus(other).items()
        env = probed(other, "c0")
        assert (units, env["ALIYUN_COM_GPU_MEM_CONTAINER"]) == (5, "5")
        assert env["ALIYUN_COM_GPU_MEM_IDX"] == str(gpu)
        want = hand_off([gpu], uuids, real_node.device_list_strategy)
        assert {k: env.get(k) for k in want} == want


# -- finding 6 --------------------------------------------------------------------------------

RELEASE, PLUGIN_NS = "forgery", "forgery-dp"
PLUGIN_SA = f"{RELEASE}-gpushare-device-plugin"
OTHER_NODE = "forgery-other"


def chart_documents(cluster: Cluster) -> list[dict[str, Any]]:
    """The device plugin's ServiceAccount, RBAC and node policies as ``helm template`` renders
    them from charts/gpushare (default values) for this cluster's Kubernetes version."""
    return identities.chart_documents(
        cluster,
        ("templates/deviceplugin-rbac.yaml", "templates/deviceplugin-policy.yaml"),
        release=RELEASE,
        namespace=PLUGIN_NS,
    )


def mounted_token(node: RealNode, uid: str) -> str:
    """The ServiceAccount token kubelet projected into the pod, read on the host."""
    volumes = node.kubelet_root / "pods" / uid / "volumes" / "kubernetes.io~projected"
    (token,) = volumes.glob("kube-api-access-*/token")
    return token.read_text()


def refusal(kubeconfig: Path, write: Callable[[LightkubeAPI], Awaitable[object]]) -> str:
    """The API server's refusal of ``write`` through the device plugin's own client, made from
    ``kubeconfig``; '' when it is allowed."""

    async def attempt() -> str:
        api = LightkubeAPI.connect(str(kubeconfig))
        try:
            await write(api)
        except KubeError as err:
            return str(err)
        finally:
            await api.close()
        return ""

    return asyncio.run(attempt())


def test_finding_6_the_device_plugins_token_is_held_to_its_own_node(
    real_node: RealNode, ns: str, tmp_path: Path
) -> None:
    """Finding 6: the device plugin's credentials reached every node and pod.

    RBAC grants the device plugin ``patch`` on nodes, ``nodes/status`` and pods, cluster-wide:
    a token taken from any GPU node's plugin pod could rewrite every node (labels,
    ``unschedulable``, the annotations the scheduler reads) and every pod. Here the chart's
    ServiceAccount and RBAC are applied, a pod of that ServiceAccount runs on the real node, and
    its token is the one the real kubelet mounted (pod-bound, naming the node). With RBAC alone
    the token writes another node and a pod on it, which is the finding. With the chart's two
    ValidatingAdmissionPolicies it may still publish on its own node through the plugin's own
    client (the inventory, ACK's three model labels, the topology), and every other write is
    refused with the policy's reason, another label or a look-alike annotation among them;
    removed again, the same write goes through, so it is the policies that refuse.
    """
    cluster = real_node.cluster
    documents = chart_documents(cluster)
    kinds = [d["kind"] for d in documents]
    assert kinds.count("ValidatingAdmissionPolicy") == 2, kinds
    rbac = [d for d in documents if not d["kind"].startswith("ValidatingAdmissionPolicy")]
    policies = [d for d in documents if d["kind"].startswith("ValidatingAdmissionPolicy")]
    cluster.create_namespace(PLUGIN_NS, check=False)
    create_nodes(cluster, [kwok_node(OTHER_NODE)])
    try:
        apply(cluster, rbac)
        check_token_scope(real_node, policies, tmp_path)
    finally:
        body = yaml.safe_dump_all([*policies, *rbac])
        cluster.kubectl("delete", "--ignore-not-found", "-f", "-", input=body, check=False)
        cluster.kubectl("delete", "namespace", PLUGIN_NS, "--wait=false", check=False)
        # kwok finishes the pod while its node exists; on a deleted node it would wait for
        # the pod garbage collector (40 s and more)
        cluster.kubectl("delete", "pod", "-n", NS, "elsewhere", "--ignore-not-found", check=False)
        delete_nodes(cluster, [OTHER_NODE])


def apply(cluster: Cluster, documents: list[dict[str, Any]]) -> None:
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(documents))


def check_token_scope(node: RealNode, policies: list[dict[str, Any]], tmp_path: Path) -> None:
    """Take the token kubelet mounted into a pod on ``node``; write with it, before, with and
    after ``policies``."""
    cluster = node.cluster
    holder = pod("token-holder", NS, [container("main", command="sleep 3600")])
    spec = with_node_name(holder)["spec"]
    spec.update(serviceAccountName=PLUGIN_SA, automountServiceAccountToken=True)
    holder["metadata"]["namespace"] = PLUGIN_NS
    cluster.kubectl("apply", "-f", "-", input=json.dumps(holder))
    running = eventually(
        lambda: (
            (item := cluster.kubectl_json("get", "pod", "-n", PLUGIN_NS, "token-holder"))[
                "status"
            ].get("phase")
            == "Running"
            and item
        ),
        60,
        "the device plugin's ServiceAccount pod Running on the real node",
    )
    kubeconfig = token_kubeconfig(
        cluster, mounted_token(node, running["metadata"]["uid"]), tmp_path / "plugin.kubeconfig"
    )
    who = json.loads(
        cluster.kubectl("auth", "whoami", "-o", "json", f"--kubeconfig={kubeconfig}").stdout
    )["status"]["userInfo"]
    assert who["username"] == f"system:serviceaccount:{PLUGIN_NS}:{PLUGIN_SA}"
    assert who["extra"]["authentication.kubernetes.io/node-name"] == [NODE_NAME]

    elsewhere = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "elsewhere", "namespace": NS},
        "spec": {
            "nodeName": OTHER_NODE,
            "containers": [{"name": "main", "image": "busybox"}],
        },
    }
    create(cluster, elsewhere)

    def as_plugin(*args: str) -> str:
        """kubectl with the plugin's token; its error text, or '' when allowed."""
        result = cluster.kubectl(*args, f"--kubeconfig={kubeconfig}", check=False)
        return "" if result.returncode == 0 else result.stderr

    def other_node_write() -> str:
        value = json.dumps({"written-by": "device-plugin token", "at": time.time()})
        return refusal(
            kubeconfig, lambda api: api.patch_node(OTHER_NODE, annotations={ANN_NODE_GPUS: value})
        )

    def elsewhere_write() -> str:
        version = get_pod(cluster, "elsewhere")["metadata"]["resourceVersion"]
        return refusal(
            kubeconfig,
            lambda api: api.patch_pod_annotations(
                NS, "elsewhere", {ANN_ASSIGNED: "true"}, resource_version=version
            ),
        )

    # RBAC alone: the token on the real node writes another node and a pod bound elsewhere
    assert other_node_write() == ""
    assert elsewhere_write() == ""
    assert as_plugin("label", "node", NODE_NAME, "forgery=rbac-only") == ""
    cluster.kubectl("label", "node", NODE_NAME, "forgery-")

    apply(cluster, policies)
    refused_elsewhere = eventually(other_node_write, 30, "the node policy in force")
    assert (
        f"the device plugin on node '{NODE_NAME}' may write that node only, not node "
        f"'{OTHER_NODE}'" in refused_elsewhere
    )
    assert f"{RELEASE}-gpushare-device-plugin-nodes" in refused_elsewhere
    refused_pod = eventually(elsewhere_write, 30, "the pod policy in force")
    assert (
        f"the device plugin on node '{NODE_NAME}' may write the pods bound to that node only, "
        f"not pod {NS}/elsewhere" in refused_pod
    )

    # its own node: the publishing the plugin does is allowed, through its own client
    own = cluster.kubectl_json("get", "node", NODE_NAME)
    published = json.loads(own["metadata"]["annotations"][ANN_NODE_GPUS])
    count = own["status"]["capacity"]["aliyun.com/gpu-count"]
    assert (
        refusal(
            kubeconfig,
            lambda api: api.patch_node(
                NODE_NAME,
                annotations={ANN_NODE_GPUS: json.dumps(published, separators=(",", ":"))},
                capacity={"aliyun.com/gpu-count": count},
            ),
        )
        == ""
    )
    # ... ACK's three model labels and the topology, as publishing writes them (and removes a
    # stale topology, and a model label the GPUs no longer share)
    model_labels = {LABEL_MODEL: "Tesla-T4", LABEL_COUNT: "4", LABEL_MEM: "15360MiB"}
    topology = topology_annotation(layout("nvlink-pairs", 4)[0])
    for notes, marks in (
        ({ANN_NODE_TOPOLOGY: topology}, model_labels),
        ({ANN_NODE_TOPOLOGY: None}, {LABEL_MODEL: None}),
    ):
        allowed = refusal(
            kubeconfig,
            lambda api, a=notes, lb=marks: api.patch_node(  # type: ignore[misc]
                NODE_NAME, annotations=a, labels=lb
            ),
        )
        assert allowed == "", allowed
    written = cluster.kubectl_json("get", "node", NODE_NAME)["metadata"]
    assert written["labels"][LABEL_COUNT] == "4" and LABEL_MODEL not in written["labels"]
    assert ANN_NODE_TOPOLOGY not in written["annotations"]
    # ... but no other label or annotation, not even one that looks like them
    for other in (
        {"labels": {"aliyun.accelerator/nvidia_driver": "550"}},
        {"labels": {"gpushare.io/gpu-topology": "x"}},
        {"annotations": {"gpushare.io/gpu-topology-v2": topology}},
    ):
        refused = refusal(
            kubeconfig,
            lambda api, o=other: api.patch_node(NODE_NAME, **o),  # type: ignore[misc, arg-type]
        )
        assert "may change only the annotations" in refused and ANN_NODE_TOPOLOGY in refused, (
            other,
            refused,
        )

    version = cluster.kubectl_json("get", "pod", "-n", PLUGIN_NS, "token-holder")["metadata"][
        "resourceVersion"
    ]
    assert (
        refusal(
            kubeconfig,
            lambda api: api.patch_pod_annotations(
                PLUGIN_NS, "token-holder", {ANN_ASSIGNED: "false"}, resource_version=version
            ),
        )
        == ""
    )

    # ... and nothing else on it
    label = as_plugin("label", "node", NODE_NAME, "forgery=policy")
    assert "may change only the annotations" in label and "labels" in label, label
    cordon = as_plugin(
        "patch", "node", NODE_NAME, "--type=merge", "-p", '{"spec":{"unschedulable":true}}'
    )
    assert "unschedulable" in cordon and "denied request" in cordon, cordon
    node_now = cluster.kubectl_json("get", "node", NODE_NAME)
    assert "forgery" not in node_now["metadata"].get("labels", {})
    assert not node_now["spec"].get("unschedulable")

    # the policies, not something else, refuse: without them the same write goes through
    cluster.kubectl("delete", "-f", "-", input=yaml.safe_dump_all(policies))
    eventually(lambda: other_node_write() == "", 30, "the cross-node write allowed again")
