"""CPU and host memory of pods and nodes, the GPU model a pod accepts, and the ledger's sums."""

from __future__ import annotations

from typing import Any

from gpushare.core.booking.ledger import Ledger
from gpushare.core.model.gpumodel import LABEL_MODEL, node_model, pod_models
from gpushare.core.model.hostresources import HostResources, node_allocatable, pod_requests
from gpushare.core.model.requests import PodRequest, read_pod
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.allocation import plan


def container(cpu: str | None = None, memory: str | None = None, **extra: Any) -> dict[str, Any]:
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    return {"name": "c", "resources": {"requests": requests}, **extra}


def pod(uid: str = "u1", node: str = "", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"containers": [container("500m", "1Gi")], **spec}
    if node:
        body["nodeName"] = node
    return {"metadata": {"name": uid, "namespace": "ns", "uid": uid}, "spec": body}


def test_requests_add_up_as_kube_scheduler_counts_them() -> None:
    assert pod_requests(pod()) == HostResources(500, 1 << 30)
    two = pod(containers=[container("1", "1Gi"), container("250m", "512Mi")])
    assert pod_requests(two) == HostResources(1250, (1 << 30) + (512 << 20))
    # an init container needs its own amount; a sidecar adds to everything after it
    init = pod(initContainers=[container("3", "100Mi")])
    assert pod_requests(init).cpu_milli == 3000
    sidecar = pod(initContainers=[container("1", "0", restartPolicy="Always")])
    assert pod_requests(sidecar).cpu_milli == 1500
    overhead = pod(overhead={"cpu": "100m", "memory": "10Mi"})
    assert pod_requests(overhead) == HostResources(600, (1 << 30) + (10 << 20))
    limits_only = pod(containers=[{"name": "c", "resources": {"limits": {"cpu": "2"}}}])
    assert pod_requests(limits_only).cpu_milli == 2000  # the API server defaults requests
    assert pod_requests(pod(containers=[container("lots")])).cpu_milli == 0  # unreadable: none
    pod_level = pod(resources={"requests": {"cpu": "4"}}, overhead={"cpu": "100m"})
    assert pod_requests(pod_level) == HostResources(4100, 1 << 30)  # memory still summed


def test_node_allocatable_and_model() -> None:
    node = {
        "metadata": {"name": "n", "labels": {LABEL_MODEL: "Tesla-T4"}},
        "status": {"allocatable": {"cpu": "7900m", "memory": "30Gi"}},
    }
    assert node_allocatable(node) == HostResources(7900, 30 << 30)
    assert node_model(node) == "Tesla-T4"
    assert node_allocatable({"metadata": {"name": "m"}}) == HostResources()


def test_models_from_node_selector_and_required_affinity() -> None:
    assert pod_models(pod()) == ()
    assert pod_models(pod(nodeSelector={LABEL_MODEL: "A10"})) == ("A10",)

    def affinity(*terms: list[dict[str, Any]]) -> dict[str, Any]:
        selector = {"nodeSelectorTerms": [{"matchExpressions": t} for t in terms]}
        return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": selector}}

    one = {"key": LABEL_MODEL, "operator": "In", "values": ["T4", "P100"]}
    other = {"key": LABEL_MODEL, "operator": "In", "values": ["A10"]}
    assert pod_models(pod(affinity=affinity([one]))) == ("P100", "T4")
    assert pod_models(pod(affinity=affinity([one], [other]))) == ("A10", "P100", "T4")
    unrelated = {"key": "zone", "operator": "In", "values": ["a"]}
    assert pod_models(pod(affinity=affinity([one], [unrelated]))) == ()  # a term allows any
    not_in = {"key": LABEL_MODEL, "operator": "NotIn", "values": ["T4"]}
    assert pod_models(pod(affinity=affinity([not_in]))) == ()
    gpu = pod(affinity=affinity([one]))
    gpu["spec"]["containers"][0]["resources"]["limits"] = {"aliyun.com/gpu-mem": "3"}
    request = read_pod(gpu)
    assert isinstance(request, PodRequest)
    assert request.models == ("P100", "T4") and request.host == HostResources(500, 1 << 30)


def test_the_ledger_sums_every_bound_pod_and_assumptions_until_seen() -> None:
    ledger = Ledger()
    before = ledger.node_version("n1")
    ledger.observe(pod("a", node="n1"))
    ledger.observe(pod("b", node="n1"))
    ledger.observe(pod("c"))  # pending: counts nowhere
    assert ledger.usage("n1").host == HostResources(1000, 2 << 30)
    assert ledger.node_version("n1") > before
    gpu = pod("d", containers=[{"name": "c", "resources": {"limits": {"aliyun.com/gpu-mem": "2"}}}])
    gpu["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "2"}
    request = read_pod(gpu)
    assert isinstance(request, PodRequest)
    ledger.assume(plan(request, node="n1", indexes=(0,), unit=MemoryUnit.GiB), request.host)
    assert ledger.usage("n1").host.cpu_milli == 3000
    assert ledger.usage("n1", excluding="d").host.cpu_milli == 1000
    ledger.observe(gpu)  # a stale event without nodeName keeps the assumption's count
    assert ledger.usage("n1").host.cpu_milli == 3000
    ledger.unassume("d")
    assert ledger.usage("n1").host.cpu_milli == 1000
    ledger.observe({**pod("a", node="n1"), "status": {"phase": "Succeeded"}})
    ledger.forget("b")
    assert ledger.usage("n1").host == HostResources()
