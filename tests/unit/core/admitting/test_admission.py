"""The admission decision: golden AdmissionReview v1 exchanges and every rejection refused."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest

from gpushare.core.admitting.admission import TEMPLATE_PATHS, AdmissionSettings, decide
from gpushare.core.model.names import ResourceNames
from gpushare.core.model.requests import Rejection, read_pod
from gpushare.core.model.units import MemoryUnit
from tests.support.admission import MEM, container, job, pod, pod_template, review

CORE = "aliyun.com/gpu-core.percentage"


def tampered() -> dict[str, Any]:
    """A pod that names its node, forges its hand-off and switches the isolation off."""
    main = container({MEM: "1"})
    main["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    obj = pod("tampered", pod_template(main))
    obj["metadata"]["annotations"] = {"ALIYUN_COM_GPU_MEM_ASSIGNED": "true"}
    obj["spec"]["nodeName"] = "gpu-node-1"
    return obj


def exchange(request: Any, settings: AdmissionSettings | None = None) -> str:
    response = decide(request, settings).review
    return json.dumps({"in": request, "out": response}, indent=2) + "\n"


CASES: dict[str, Any] = {
    "valid_pod": review(pod("seed", pod_template(container({MEM: "3"})))),
    "bad_core_percentage": review(pod("bad-core", pod_template(container({MEM: "2", CORE: "33"})))),
    "gpu_count_not_dividing": review(
        pod(
            "split",
            pod_template(container({MEM: "3"}), labels={"aliyun.com/gpu-count": "2"}),
        )
    ),
    "missing_scheduler_warning": review(
        pod("no-sched", pod_template(container({MEM: "3"}), scheduler=None))
    ),
    "missing_scheduler_steered": review(
        job("no-sched", pod_template(container({MEM: "3"}), scheduler=None))
    ),
    "job_bad_core": review(
        job("train", pod_template(container({MEM: "4", CORE: "33"}, name="trainer")))
    ),
    "job_valid": review(job("infer", pod_template(container({MEM: "4", CORE: "30"})))),
    "malformed_request": {"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"},
    "tampered_pod": review(tampered()),
}


CASE_SETTINGS = {"missing_scheduler_warning": AdmissionSettings(steer_from=())}
"""Without steering (``gpushare webhook --no-steer``) a pod naming no scheduler is warned."""


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_admission_reviews(case: str, golden: Callable[[str, str], None]) -> None:
    golden(f"admission_{case}.json", exchange(CASES[case], CASE_SETTINGS.get(case)))


def response(request: Any, settings: AdmissionSettings | None = None) -> dict[str, Any]:
    result: dict[str, Any] = decide(request, settings).review["response"]
    return result


def test_response_echoes_the_uid_and_the_version() -> None:
    request = CASES["valid_pod"]
    answer = decide(request).review
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    assert answer["response"] == {"uid": request["request"]["uid"], "allowed": True}


def test_job_refusal_names_container_path_field_value_rule_and_fix() -> None:
    answer = response(CASES["job_bad_core"])
    assert answer["allowed"] is False
    assert answer["status"]["code"] == 422
    message = answer["status"]["message"]
    assert "Job team-a/train" in message
    assert 'container "trainer" (spec.template.spec.containers[0])' in message
    assert f"limits[\"{CORE}\"]='33' is not a multiple of 5" in message
    assert "shared in steps of 5: use 5, 10, ... 100" in message


def test_missing_scheduler_is_a_warning_not_a_refusal() -> None:
    answer = response(CASES["missing_scheduler_warning"])
    assert answer["allowed"] is True
    (warning,) = answer["warnings"]
    assert "spec.schedulerName is not set" in warning and "ack-co-scheduler" in warning
    other = review(pod("other", pod_template(container({MEM: "3"}), scheduler="volcano")))
    assert "'volcano'" in response(other)["warnings"][0]


def test_non_gpu_objects_and_other_operations_are_allowed_untouched() -> None:
    plain = review(pod("web", pod_template(container({"cpu": "1"}), scheduler=None)))
    assert response(plain) == {"uid": plain["request"]["uid"], "allowed": True}
    bad = CASES["bad_core_percentage"]
    deleting = copy.deepcopy(bad)
    deleting["request"]["operation"] = "DELETE"
    assert response(deleting)["allowed"] is True
    service = copy.deepcopy(bad)
    service["request"]["kind"] = {"group": "", "version": "v1", "kind": "Service"}
    assert response(service)["allowed"] is True


WORKLOADS = {
    "Deployment": lambda t: {"spec": {"template": t}},
    "StatefulSet": lambda t: {"spec": {"template": t}},
    "DaemonSet": lambda t: {"spec": {"template": t}},
    "ReplicaSet": lambda t: {"spec": {"template": t}},
    "ReplicationController": lambda t: {"spec": {"template": t}},
    "CronJob": lambda t: {"spec": {"jobTemplate": {"spec": {"template": t}}}},
}


@pytest.mark.parametrize("kind", sorted(WORKLOADS))
def test_every_workload_kind_is_checked_through_its_pod_template(kind: str) -> None:
    assert kind in TEMPLATE_PATHS
    template = pod_template(container({MEM: "2", CORE: "7"}))
    obj = {
        "kind": kind,
        "metadata": {"name": "w", "namespace": "team-a"},
        **WORKLOADS[kind](template),
    }
    answer = response(review(obj))
    assert answer["allowed"] is False
    path = ".".join(TEMPLATE_PATHS[kind])
    assert f"({path}.spec.containers[0])" in answer["status"]["message"]


INVALID_TEMPLATES = [
    pod_template(container({MEM: bad})) for bad in ("0", "-1", "1.5", "3Gi", "three")
] + [
    pod_template(container({CORE: "30"})),
    pod_template(container({MEM: "2", CORE: "105"})),
    pod_template(container({MEM: "4", CORE: "5"}), labels={"aliyun.com/gpu-count": "2"}),
    pod_template(container({MEM: "3"}), labels={"aliyun.com/gpu-count": "x"}),
    pod_template(container({"cpu": "1"}), labels={"aliyun.com/gpu-count": "2"}),
    pod_template({"name": "c", "resources": {"limits": {MEM: "3"}, "requests": {MEM: "2"}}}),
    pod_template({"name": "c", "resources": {"requests": {MEM: "2"}}}),
]


@pytest.mark.parametrize("template", INVALID_TEMPLATES)
def test_every_rejection_of_the_core_is_refused_with_all_its_reasons(
    template: dict[str, Any],
) -> None:
    for obj in (pod("p", template), job("j", template)):
        read = read_pod(obj if obj["kind"] == "Pod" else obj["spec"]["template"])
        assert isinstance(read, Rejection)
        answer = response(review(obj))
        assert answer["allowed"] is False and answer["status"]["code"] == 422
        for reason in read.reasons:
            expected = (
                reason.replace("(spec.", "(spec.template.spec.") if obj["kind"] == "Job" else reason
            )
            assert expected in answer["status"]["message"]


def test_configured_names_and_unit_are_respected() -> None:
    names = ResourceNames(
        mem="example.com/vgpu-mem", core="example.com/vgpu-core", count="example.com/vgpu"
    )
    settings = AdmissionSettings(names=names, unit=MemoryUnit.MiB128)
    renamed = review(pod("r", pod_template(container({names.mem: "1.5"}))))
    message = response(renamed, settings)["status"]["message"]
    assert 'limits["example.com/vgpu-mem"]' in message
    assert "counts whole units of 128MiB" in message
    # the default names mean nothing to this cluster
    assert response(CASES["bad_core_percentage"], settings)["allowed"] is True
    split = review(
        pod("s", pod_template(container({names.mem: "3"}), labels={"aliyun.com/gpu-count": "2"}))
    )
    assert "3x128MiB (0.375 GiB)" in response(split, settings)["status"]["message"]


def test_update_keeping_an_old_invalid_request_is_allowed_with_a_warning() -> None:
    bad = CASES["bad_core_percentage"]["request"]["object"]
    relabelled = copy.deepcopy(bad)
    relabelled["metadata"]["labels"] = {"team": "a"}
    answer = response(review(relabelled, "UPDATE", old=bad))
    assert answer["allowed"] is True and "not a multiple of 5" in answer["warnings"][0]
    good = CASES["valid_pod"]["request"]["object"]
    assert response(review(bad, "UPDATE", old=good))["allowed"] is False


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ([], "the body is list"),
        ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}, "request.uid"),
        ("text", "the body is str"),
    ],
)
def test_unreadable_requests_are_denied_with_a_reason(body: Any, needle: str) -> None:
    answer = response(body)
    assert answer["allowed"] is False and answer["status"]["code"] == 400
    assert needle in answer["status"]["message"]


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda o: o.update(spec="x"), "spec: expected an object, got a string"),
        (
            lambda o: o["spec"].update(containers="x"),
            "spec.containers: expected a list, got a string",
        ),
        (
            lambda o: o["spec"].update(containers=[3]),
            "spec.containers[0]: expected an object, got a number",
        ),
        (
            lambda o: o["spec"]["containers"][0]["resources"].update(limits=["x"]),
            "spec.containers[0].resources.limits: expected an object, got a list",
        ),
        (
            lambda o: o["metadata"].update(labels=[1]),
            "metadata.labels: expected an object, got a list",
        ),
        (lambda o: o.pop("spec") and None, ""),
    ],
)
def test_malformed_objects_are_denied_not_crashed_on(
    mutate: Callable[[dict[str, Any]], None], needle: str
) -> None:
    request = copy.deepcopy(CASES["bad_core_percentage"])
    mutate(request["request"]["object"])
    answer = response(request)
    if needle:
        assert answer["allowed"] is False and answer["status"]["code"] == 400
        assert needle in answer["status"]["message"]
    else:  # a pod without spec asks for nothing
        assert answer["allowed"] is True
    missing = copy.deepcopy(CASES["job_bad_core"])
    missing["request"]["object"] = None
    assert "request.object" in response(missing)["status"]["message"]
