"""Listed and watched objects come in as JSON, without what the extender never reads.

lightkube decodes them straight to dicts (no model per field), and ``_slim`` drops each
object's ``managedFields``, a node's image list and the condition lists. Whatever the core
reads of a node or a pod reads the same on the slim object.
"""

from __future__ import annotations

import json
from typing import Any

from lightkube.core import decoders

from gpushare.core.booking.ledger import Ledger
from gpushare.core.booking.waiting import Waiting
from gpushare.core.decision.clusterstate import ClusterState
from gpushare.core.decision.scheduling import Scheduler, Settings
from gpushare.core.decision.verbs import BindAsk, FilterAsk, filter_pod, reserve_bind
from gpushare.core.model.hostresources import pod_requests
from gpushare.core.model.inventory import read_node
from gpushare.core.model.kubejson import namespace_of, node_name_of, stored_uid_of, uid_of
from gpushare.core.model.requests import PodRequest, read_pod
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.allocation import plan
from gpushare.core.records.trust import SealKey, Trust
from gpushare.core.resourcepolicies.policybook import PolicyBook, placing_of
from gpushare.kube.lightkube_api import _NodeJSON, _PodJSON, _slim
from gpushare.kube.objects import gpu_node, gpu_pod, placed
from gpushare.kube.pendingpods import PendingPods
from tests.support.policies import node, policy_obj

MANAGED = [{"manager": "kubectl", "operation": "Update", "fieldsV1": {"f:spec": {}}}]
CONDITIONS = [{"type": "Ready", "status": "True"}]


def _as_listed(obj: dict[str, Any], version: str) -> dict[str, Any]:
    listed = json.loads(json.dumps(obj))
    listed["metadata"].update(resourceVersion=version, uid=f"uid-{version}", managedFields=MANAGED)
    listed.setdefault("status", {})["conditions"] = CONDITIONS
    return listed


def _node() -> dict[str, Any]:
    node = _as_listed(gpu_node("n0", gpus_units=[15, 15]), "7")
    node["status"]["images"] = [{"names": ["busybox"], "sizeBytes": 1}]
    return node


def _pod() -> dict[str, Any]:
    obj = gpu_pod("p", mem=3)
    obj["metadata"]["uid"] = "uid-8"
    request = read_pod(obj)
    assert isinstance(request, PodRequest)
    allocation = plan(request, node="n0", indexes=[1], unit=MemoryUnit.GiB)
    pod = placed(obj, allocation, trust=Trust.sealed(SealKey(b"k" * 32)))
    pod["status"] = {"phase": "Running", "containerStatuses": [{"name": "main"}]}
    return _as_listed(pod, "8")


def test_a_listed_page_decodes_to_plain_json_without_what_is_never_read() -> None:
    body = json.dumps({"metadata": {"resourceVersion": "9"}, "items": [_pod()]}).encode()
    _, version, items = decoders.decode_list(body, _PodJSON)
    assert version == "9"
    [item] = items
    assert isinstance(item, dict)
    pod = _slim(item, "Pod")
    assert type(pod) is dict
    assert "managedFields" not in pod["metadata"] and "conditions" not in pod["status"]
    full = _pod()
    del full["metadata"]["managedFields"], full["status"]["conditions"]
    assert pod == full


def test_a_watched_object_gives_lightkube_its_resource_version() -> None:
    obj = decoders.decode_object(json.dumps(_node()).encode(), _NodeJSON)
    assert obj.metadata.resourceVersion == "7"
    node = _slim(obj, "Node")
    assert set(node["status"]) == {"capacity", "allocatable", "addresses"}
    assert "managedFields" not in node["metadata"]


def test_the_core_reads_a_slim_object_as_the_whole_one() -> None:
    node, pod = _node(), _pod()
    assert read_node(_slim(node, "Node")) == read_node(node)
    slim = _slim(pod, "Pod")
    assert read_pod(slim) == read_pod(pod)
    assert pod_requests(slim) == pod_requests(pod)
    assert (uid_of(slim), node_name_of(slim)) == (uid_of(pod), node_name_of(pod))
    assert slim["status"]["containerStatuses"] == pod["status"]["containerStatuses"]


# A pod kube-scheduler has not placed yet, kept by the extender until it is bound: bind decides
# from the kept copy, which holds only what the core reads (``read_fields``, ``PendingPods``).

NOW_NS = 1_767_226_200 * 10**9
SEAL = Trust.sealed(SealKey(b"k" * 32))
MISSING = object()


def _pending_pod() -> dict[str, Any]:
    """An unbound GPU pod as the API server gives it, with a field of each kind the core
    reads and the defaults and kubelet-only fields that make most of its size."""
    pod = gpu_pod("web-0", mem=4)
    pod["metadata"].update(
        uid="uid-web-0",
        resourceVersion="41",
        creationTimestamp="2026-01-01T00:10:00Z",
        labels={"app": "web"},
        annotations={"team": "vision"},
        ownerReferences=[{"kind": "ReplicaSet", "name": "web", "uid": "rs", "controller": True}],
    )
    spec = pod["spec"]
    mount = {"name": "token", "mountPath": "/var/run/secrets", "readOnly": True}
    spec["containers"][0].update(
        image="registry.example/web:1",
        env=[{"name": "MODE", "value": "serve"}],
        volumeMounts=[mount],
        readinessProbe={"httpGet": {"path": "/ready", "port": 8080}},
        terminationMessagePath="/dev/termination-log",
    )
    spec["containers"][0]["resources"]["requests"] = {"cpu": "500m", "memory": "1Gi"}
    spec.update(
        initContainers=[
            {
                "name": "proxy",
                "image": "registry.example/proxy:1",
                "restartPolicy": "Always",
                "resources": {"requests": {"cpu": "100m"}},
                "volumeMounts": [mount],
            }
        ],
        overhead={"cpu": "10m"},
        nodeSelector={"zone": "z1"},
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "pool", "operator": "In", "values": ["a", "b"]}
                            ]
                        }
                    ]
                }
            }
        },
        tolerations=[{"key": "node.kubernetes.io/not-ready", "operator": "Exists"}],
        volumes=[
            {"name": "token", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}},
            {"name": "data", "persistentVolumeClaim": {"claimName": "web-data"}},
        ],
        dnsPolicy="ClusterFirst",
        serviceAccountName="default",
        priority=0,
    )
    pod["status"] = {"phase": "Pending", "qosClass": "Burstable"}
    return pod


class _Reading(dict[str, Any]):
    """A pod, or part of one, that notes the path of every field read of it."""

    def __init__(self, data: dict[str, Any], path: tuple[Any, ...], read: set[Any]) -> None:
        super().__init__({k: _reading(v, (*path, k), read) for k, v in data.items()})
        self._path, self._read = path, read

    def _note(self, key: object) -> None:
        self._read.add((*self._path, key))

    def __getitem__(self, key: str) -> Any:
        self._note(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        self._note(key)
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        self._note(key)
        return super().__contains__(key)

    def __iter__(self) -> Any:
        for key in super().__iter__():
            self._note(key)
            yield key

    def keys(self) -> Any:
        return list(iter(self))

    def items(self) -> Any:
        return [(k, super(_Reading, self).__getitem__(k)) for k in self]

    def values(self) -> Any:
        return [v for _, v in self.items()]


def _reading(value: Any, path: tuple[Any, ...], read: set[Any]) -> Any:
    if isinstance(value, dict):
        return _Reading(value, path, read)
    if isinstance(value, list):
        return [_reading(v, (*path, i), read) for i, v in enumerate(value)]
    return value


def _at(obj: Any, path: tuple[Any, ...]) -> Any:
    """What a reader finds at ``path``: a scalar, the kind of a dict and the length of a
    list (their insides are paths of their own), or MISSING."""
    for step in path:
        found = isinstance(obj, dict) and step in obj
        found = found or (isinstance(obj, list) and isinstance(step, int) and step < len(obj))
        if not found:
            return MISSING
        obj = obj[step]
    if isinstance(obj, dict):
        return dict
    if isinstance(obj, list):
        return ("list", len(obj))
    return obj


def _decisions(pod: dict[str, Any]) -> tuple[Any, ...]:
    """Each decision the extender makes from a kept pending pod, in a fresh world: the bind's
    plan (with a ResourcePolicy over its labels), the ledger's reading of the pod, its
    ResourcePolicy placing, its namespace and UID (intents), and, for good measure, the filter
    as if the pod had come in the request, with the policy and without."""

    def world(*, policies: bool = True) -> tuple[Scheduler, ClusterState]:
        nodes = [node("a1", "a"), node("b1", "b")]
        for each in nodes:
            each["metadata"]["labels"]["zone"] = "z1"
        book = PolicyBook()
        book.put_policy(policy_obj())
        state = ClusterState(settings=Settings(), trust=SEAL, book=book if policies else None)
        for each in nodes:
            state.apply_node("ADDED", each)
        return Scheduler(Settings()), state

    scheduler, state = world()
    ask = FilterAsk(
        pod=pod,
        names=["a1", "b1"],
        now_ns=NOW_NS,
        ttl_ns=30 * 10**9,
        unseen_ttl_ns=60 * 10**9,
        stuck={},
        packing_profile="ack-co-scheduler",
    )
    filtered = filter_pod(scheduler, state, ask, Waiting())
    scheduler, state = world(policies=False)
    unbooked = filter_pod(scheduler, state, ask, Waiting())
    scheduler, state = world()
    planned = reserve_bind(
        scheduler, state, BindAsk(pod=pod, node="a1", asked_uid="uid-web-0", now_ns=NOW_NS)
    )
    again = reserve_bind(
        scheduler, state, BindAsk(pod=pod, node="b1", asked_uid="uid-web-0", now_ns=NOW_NS)
    )
    observed = Ledger(trust=SEAL).observe(pod)
    return (
        filtered,
        unbooked,
        planned,
        again,
        observed,
        placing_of(pod),
        namespace_of(pod),
        stored_uid_of(pod),
        read_pod(pod),
        pod_requests(pod),
    )


def test_every_field_a_decision_reads_of_a_pending_pod_is_kept() -> None:
    whole = _pending_pod()
    read: set[tuple[Any, ...]] = set()
    _decisions(_Reading(whole, (), read))
    kept = PendingPods()
    kept["uid-web-0"] = whole
    slim = kept["uid-web-0"]
    assert ("spec", "containers", 0, "resources") in read  # the recording saw the reads
    differ = {p: (_at(whole, p), _at(slim, p)) for p in read if _at(whole, p) != _at(slim, p)}
    assert not differ


def test_a_decision_from_the_kept_pending_pod_equals_the_one_from_the_whole_pod() -> None:
    whole = _pending_pod()
    kept = PendingPods()
    kept["uid-web-0"] = whole
    decided = _decisions(whole)
    assert decided[2].__class__.__name__ == "BindPlan"  # the bind would write, not refuse
    assert _decisions(kept["uid-web-0"]) == decided


def test_a_pending_pod_is_kept_without_what_only_kubelet_reads() -> None:
    whole = _pending_pod()
    kept = PendingPods()
    kept["uid-web-0"] = whole
    slim = kept["uid-web-0"]
    assert slim["spec"]["volumes"] == [
        {"name": "token", "projected": {}},
        whole["spec"]["volumes"][1],
    ]
    for container in (*slim["spec"]["containers"], *slim["spec"]["initContainers"]):
        assert not {"image", "env", "volumeMounts", "readinessProbe"} & set(container)
    assert not {"tolerations", "dnsPolicy", "serviceAccountName"} & set(slim["spec"])
    assert slim["status"] == {"phase": "Pending"}
    assert slim["metadata"] == whole["metadata"]
    assert slim is not kept["uid-web-0"]  # each read is a copy of its own
