"""The mutating webhook's decision: GPU pods naming no scheduler are given gpushare's."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import pytest

from gpushare.core.admitting.admission import AdmissionSettings, mutate
from gpushare.core.model.names import ResourceNames
from tests.support.admission import MEM, container, job, pod, pod_template, review


def patched(decision_review: dict[str, Any], obj: dict[str, Any]) -> dict[str, Any]:
    """Apply the response's JSON Patch (the ``add`` operations this webhook sends) to a copy."""
    response = decision_review["response"]
    out = json.loads(json.dumps(obj))
    if "patch" not in response:
        return out
    assert response["patchType"] == "JSONPatch"
    for op in json.loads(base64.b64decode(response["patch"])):
        assert op["op"] == "add"
        *parents, last = op["path"].strip("/").split("/")
        node = out
        for key in parents:
            node = node[key]
        node[last] = op["value"]
    return out


def gpu_pod(scheduler: str | None = "default-scheduler", **spec: Any) -> dict[str, Any]:
    obj = pod("seed", pod_template(container({MEM: "3"}), scheduler=scheduler))
    obj["spec"].update(spec)
    return obj


def test_golden_steered_pod(golden: Callable[[str, str], None]) -> None:
    request = review(gpu_pod())
    golden(
        "admission_steered_pod.json",
        json.dumps({"in": request, "out": mutate(request).review}, indent=2) + "\n",
    )


@pytest.mark.parametrize("scheduler", ["default-scheduler", None, ""])
def test_a_gpu_pod_naming_no_scheduler_gets_gpushares(scheduler: str | None) -> None:
    obj = gpu_pod(scheduler)
    decision = mutate(review(obj))
    assert decision.allowed and decision.decision == "mutated"
    assert patched(decision.review, obj)["spec"]["schedulerName"] == "ack-co-scheduler"
    (warning,) = decision.review["response"]["warnings"]
    assert "team-a/seed" in warning and "ack-co-scheduler" in warning and MEM in warning


def test_a_gpu_request_in_an_init_container_is_steered_too() -> None:
    obj = pod("init", pod_template(container(name="main"), scheduler=None))
    obj["spec"]["initContainers"] = [container({MEM: "2"}, name="warmup")]
    decision = mutate(review(obj))
    assert patched(decision.review, obj)["spec"]["schedulerName"] == "ack-co-scheduler"


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param(gpu_pod("my-scheduler"), id="another scheduler named"),
        pytest.param(gpu_pod("ack-co-scheduler"), id="gpushare's already"),
        pytest.param(pod("cpu", pod_template(container({"cpu": "1"}), scheduler=None)), id="cpu"),
        pytest.param(gpu_pod(nodeName="gpu-node-1"), id="nodeName set (validation refuses)"),
        pytest.param(
            pod("bad", pod_template(container({MEM: "2", "aliyun.com/gpu-core.percentage": "33"}))),
            id="invalid request (validation refuses)",
        ),
        pytest.param({"kind": "Pod", "metadata": {"name": "x", "namespace": "a"}}, id="no spec"),
    ],
)
def test_other_pods_are_left_as_they_are(obj: dict[str, Any]) -> None:
    if obj.get("spec", {}).get("schedulerName") is None and "spec" in obj:
        obj["spec"]["schedulerName"] = "default-scheduler"
    decision = mutate(review(obj))
    assert decision.allowed
    assert decision.decision == "allowed"
    assert "patch" not in decision.review["response"]


def test_only_pod_creation_is_steered() -> None:
    obj = gpu_pod()
    assert "patch" not in mutate(review(obj, "UPDATE", old=obj)).review["response"]
    template = pod_template(container({MEM: "3"}), scheduler=None)
    assert "patch" not in mutate(review(job("train", template))).review["response"]


def test_steering_can_be_turned_off() -> None:
    decision = mutate(review(gpu_pod()), AdmissionSettings(steer_from=()))
    assert decision.decision == "allowed" and "patch" not in decision.review["response"]


def test_the_names_and_the_target_follow_the_settings() -> None:
    names = ResourceNames(mem="example.com/gpu-mem", core="example.com/gpu-core")
    obj = pod("renamed", pod_template(container({names.mem: "3"}), scheduler="legacy"))
    settings = AdmissionSettings(names=names, scheduler_name="gpu-sched", steer_from=("legacy",))
    decision = mutate(review(obj), settings)
    assert patched(decision.review, obj)["spec"]["schedulerName"] == "gpu-sched"
    assert mutate(review(gpu_pod()), settings).decision == "allowed"  # aliyun.com is not ours


def test_an_unreadable_review_is_denied_with_the_reason() -> None:
    decision = mutate({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"})
    assert not decision.allowed and decision.decision == "malformed"
    assert "admissionReviewVersions" in decision.review["response"]["status"]["message"]
    assert mutate([1, 2]).decision == "malformed"
