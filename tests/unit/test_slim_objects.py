"""Listed and watched objects come in as JSON, without what the extender never reads.

lightkube decodes them straight to dicts (no model per field), and ``_slim`` drops each
object's ``managedFields``, a node's image list and the condition lists. Whatever the core
reads of a node or a pod reads the same on the slim object.
"""

from __future__ import annotations

import json
from typing import Any

from lightkube.core import decoders

from gpushare.core.model.hostresources import pod_requests
from gpushare.core.model.inventory import read_node
from gpushare.core.model.kubejson import node_name_of, uid_of
from gpushare.core.model.requests import PodRequest, read_pod
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.allocation import plan
from gpushare.core.records.trust import SealKey, Trust
from gpushare.kube.lightkube_api import _NodeJSON, _PodJSON, _slim
from gpushare.kube.objects import gpu_node, gpu_pod, placed

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
