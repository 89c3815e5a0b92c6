"""Tolerations the steering webhook adds to GPU pods (``webhook.steer.tolerations``).

Kubernetes' ExtendedResourceToleration tolerates only the requested resource's key
(kubernetes/kubernetes#55839, ../shared/docs/PLATFORMS.md [S8]), so a pod asking for
aliyun.com/gpu-mem stays Pending on GKE's GPU nodes, tainted nvidia.com/gpu=present:NoSchedule
(C3, G6), unless something adds nvidia.com/gpu's toleration.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from gpushare.core.admitting.admission import AdmissionSettings, mutate
from gpushare.core.admitting.tolerations import (
    Toleration,
    from_json,
    missing,
    parse_toleration,
)
from tests.support.admission import MEM, container, pod, pod_template, review

GKE = Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")
SETTINGS = AdmissionSettings(steer_tolerations=(GKE,))


def applied(decision_review: dict[str, Any], obj: dict[str, Any]) -> dict[str, Any]:
    """The pod after the response's JSON patch (``add`` only; ``-`` appends to a list)."""
    out = json.loads(json.dumps(obj))
    response = decision_review["response"]
    if "patch" not in response:
        return out
    for op in json.loads(base64.b64decode(response["patch"])):
        assert op["op"] == "add"
        *parents, last = op["path"].strip("/").split("/")
        node = out
        for key in parents:
            node = node[key]
        if last == "-":
            node.append(op["value"])
        else:
            node[last] = op["value"]
    return out


def gpu_pod(scheduler: str | None, tolerations: Any = None) -> dict[str, Any]:
    obj = pod("train", pod_template(container({MEM: "3"}), scheduler=scheduler))
    if tolerations is not None:
        obj["spec"]["tolerations"] = tolerations
    return obj


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("nvidia.com/gpu:NoSchedule", GKE),
        ("nvidia.com/gpu", Toleration(key="nvidia.com/gpu", operator="Exists")),
        ("sku=gpu:NoSchedule", Toleration(key="sku", value="gpu", effect="NoSchedule")),
        ('{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}', GKE),
        (
            '{"key": "k", "operator": "Equal", "value": "v", "effect": "NoExecute", '
            '"tolerationSeconds": 30}',
            Toleration(key="k", value="v", effect="NoExecute", toleration_seconds=30),
        ),
    ],
)
def test_a_toleration_is_written_as_key_value_effect_or_json(
    text: str, expected: Toleration
) -> None:
    assert parse_toleration(text) == expected


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("nvidia.com/gpu:NoStart", "effect='NoStart' is not one of NoSchedule"),
        ('{"key": "k", "operator": "In"}', "operator='In' is not one of Exists, Equal"),
        ('{"key": "k", "operator": "Exists", "value": "v"}', "Exists takes no value"),
        ('{"operator": "Equal", "value": "v"}', "without a key must use operator Exists"),
        ('{"key": "k", "effect": "NoSchedule", "tolerationSeconds": 5}', "only allowed with"),
        ('{"key": "k", "colour": "red"}', "unknown field(s) colour"),
        ('{"key": ', "is not JSON"),
        ('{"key": "k", "tolerationSeconds": "5"}', "is not a whole number"),
    ],
)
def test_a_bad_toleration_is_refused_naming_the_field_and_rule(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        parse_toleration(text)


def test_missing_leaves_out_what_the_pod_holds_and_repeats() -> None:
    held = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    other = Toleration(key="sku", value="gpu", effect="NoSchedule")
    assert missing(held, [GKE, other, other]) == [other]
    assert missing(None, [GKE]) == [GKE]
    # an unreadable toleration of the pod counts as none (the API server validates pods)
    assert missing([{"operator": "Sometimes"}], [GKE]) == [GKE]
    assert from_json({"key": "k"}).as_json() == {"key": "k", "operator": "Equal"}


@pytest.mark.parametrize("scheduler", ["default-scheduler", None])
def test_a_steered_pod_gets_the_tolerations_and_the_scheduler(scheduler: str | None) -> None:
    obj = gpu_pod(scheduler)
    decision = mutate(review(obj), SETTINGS)
    assert decision.decision == "mutated"
    after = applied(decision.review, obj)
    assert after["spec"]["schedulerName"] == "ack-co-scheduler"
    assert after["spec"]["tolerations"] == [GKE.as_json()]
    steer, tolerate = decision.review["response"]["warnings"]
    assert "schedulerName" in steer and '"key": "nvidia.com/gpu"' in tolerate


def test_a_pod_naming_gpushares_scheduler_gets_the_tolerations_only() -> None:
    """Before the tolerations, such a pod was never changed (and stayed Pending on GKE)."""
    own = [{"key": "team", "operator": "Equal", "value": "a", "effect": "NoSchedule"}]
    obj = gpu_pod("ack-co-scheduler", own)
    decision = mutate(review(obj), SETTINGS)
    assert decision.decision == "mutated"
    after = applied(decision.review, obj)
    assert after["spec"]["schedulerName"] == "ack-co-scheduler"
    assert after["spec"]["tolerations"] == [*own, GKE.as_json()]
    (warning,) = decision.review["response"]["warnings"]
    assert "toleration" in warning
    assert mutate(review(obj)).decision == "allowed"  # no tolerations listed: untouched


def test_a_pod_that_already_tolerates_or_asks_no_gpu_is_left_alone() -> None:
    held = [GKE.as_json()]
    assert mutate(review(gpu_pod("ack-co-scheduler", held)), SETTINGS).decision == "allowed"
    plain = pod("web", pod_template(container(), scheduler="ack-co-scheduler"))
    assert mutate(review(plain), SETTINGS).decision == "allowed"
    other = gpu_pod("volcano")
    assert mutate(review(other), SETTINGS).decision == "allowed"
    off = AdmissionSettings(steer_from=(), steer_tolerations=(GKE,))
    assert mutate(review(gpu_pod("ack-co-scheduler")), off).decision == "allowed"
