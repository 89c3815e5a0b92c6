"""What kube-scheduler's remaining score plugins weigh (core.placement.preferences)."""

from __future__ import annotations

from typing import Any

import pytest

from gpushare.core.placement.preferences import (
    PlacedTerms,
    has_prefer_no_schedule_taint,
    selector_matches,
    stated_preference,
)
from gpushare.kube.objects import gpu_pod


def pod(**spec: Any) -> dict[str, Any]:
    made = gpu_pod("p", mem=3)
    made["spec"].update(spec)
    return made


def term(selector: Any, **extra: Any) -> dict[str, Any]:
    return {"labelSelector": selector, "topologyKey": "kubernetes.io/hostname", **extra}


def weighted(selector: Any, **extra: Any) -> list[dict[str, Any]]:
    return [{"weight": 10, "podAffinityTerm": term(selector, **extra)}]


PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({}, ""),
        ({"nodeSelector": {"a": "b"}}, ""),
        (
            {"affinity": {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{}]}}}},
            "",
        ),
        ({"affinity": {"podAntiAffinity": {REQUIRED: [term({})]}}}, ""),
        (
            {"affinity": {"nodeAffinity": {PREFERRED: [{"weight": 1, "preference": {}}]}}},
            "preferred node affinity",
        ),
        ({"affinity": {"podAffinity": {PREFERRED: weighted({})}}}, "preferred podAffinity"),
        (
            {"affinity": {"podAntiAffinity": {PREFERRED: weighted({})}}},
            "preferred podAntiAffinity",
        ),
        ({"topologySpreadConstraints": [{"whenUnsatisfiable": "DoNotSchedule"}]}, ""),
        (
            {"topologySpreadConstraints": [{"whenUnsatisfiable": "ScheduleAnyway"}]},
            "topologySpreadConstraints with ScheduleAnyway",
        ),
        ({"resourceClaims": [{"name": "gpu"}]}, "resourceClaims"),
        ({"volumes": [{"name": "v", "emptyDir": {}}]}, ""),
        ({"volumes": [{"name": "v", "persistentVolumeClaim": {}}]}, "persistent volumes"),
        ({"volumes": [{"name": "v", "ephemeral": {}}]}, "persistent volumes"),
        ({"affinity": "garbage", "volumes": "garbage"}, ""),
    ],
)
def test_what_the_pod_states_that_kube_scheduler_scores(spec: dict[str, Any], words: str) -> None:
    assert stated_preference(pod(**spec)) == words


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        (None, {"app": "a"}, False),
        ({}, {}, True),
        ({"matchLabels": {"app": "a"}}, {"app": "a", "x": "y"}, True),
        ({"matchLabels": {"app": "a"}}, {"app": "b"}, False),
        ({"matchExpressions": [{"key": "app", "operator": "In", "values": ["a"]}]}, {}, False),
        ({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["a"]}]}, {}, True),
        (
            {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["a"]}]},
            {"app": "a"},
            False,
        ),
        ({"matchExpressions": [{"key": "app", "operator": "Exists"}]}, {"app": ""}, True),
        ({"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}, {"app": ""}, False),
        # what cannot be read may match
        ({"matchExpressions": [{"key": "app", "operator": "Gt", "values": ["1"]}]}, {}, True),
        ("garbage", {}, True),
    ],
)
def test_label_selectors_as_affinity_terms_read_them(
    selector: Any, labels: dict[str, str], matches: bool
) -> None:
    assert selector_matches(selector, labels) is matches


def placed(name: str, namespace: str = "default", **affinity: Any) -> dict[str, Any]:
    made = gpu_pod(name, mem=1, namespace=namespace)
    made["metadata"]["uid"] = f"uid-{name}"
    made["spec"]["nodeName"] = "n0"
    made["spec"]["affinity"] = affinity
    return made


def incoming(namespace: str = "default", **labels: str) -> dict[str, Any]:
    made = gpu_pod("new", mem=1, namespace=namespace)
    made["metadata"]["labels"] = labels
    return made


def test_placed_pods_terms_that_score_are_kept_and_matched_by_namespace_and_labels() -> None:
    app_a = {"matchLabels": {"app": "a"}}
    terms = PlacedTerms(
        [
            # required anti-affinity only filters: not kept
            placed("anti", podAntiAffinity={REQUIRED: [term({})]}),
            placed("soft", podAntiAffinity={PREFERRED: weighted(app_a)}),
        ]
    )
    assert len(terms) == 1
    assert terms.matching(incoming(app="a"))
    assert not terms.matching(incoming(app="b"))
    assert not terms.matching(incoming("other", app="a")), "the placed pod's own namespace"
    terms.observe(placed("req", "team", podAffinity={REQUIRED: [term({}, namespaces=["x"])]}))
    assert terms.matching(incoming("x")) and not terms.matching(incoming("team"))
    terms.observe(
        placed("sel", "team", podAffinity={PREFERRED: weighted({}, namespaceSelector={})})
    )
    assert terms.matching(incoming("anywhere")), "namespaces chosen by labels may be any"
    terms.forget("uid-sel")
    terms.forget("uid-req")
    terms.forget("uid-soft")
    assert len(terms) == 0 and not terms.matching(incoming(app="a"))


def test_a_pending_pods_terms_count_once_it_is_bound() -> None:
    pending = placed("soft", podAffinity={PREFERRED: weighted({})})
    del pending["spec"]["nodeName"]
    terms = PlacedTerms([pending])
    assert not terms.matching(incoming())
    pending["spec"]["nodeName"] = "n0"
    terms.observe(pending)
    assert terms.matching(incoming())


def test_a_finished_pods_terms_no_longer_count() -> None:
    done = placed("soft", podAffinity={PREFERRED: weighted({})})
    terms = PlacedTerms([done])
    assert terms.matching(incoming())
    done["status"] = {"phase": "Succeeded"}
    terms.observe(done)
    assert not terms.matching(incoming())
    assert len(PlacedTerms([done])) == 0


def test_prefer_no_schedule_taints() -> None:
    def node(*effects: str) -> dict[str, Any]:
        taints = [{"key": "k", "effect": e} for e in effects]
        return {"metadata": {"name": "n"}, "spec": {"taints": taints}}

    assert not has_prefer_no_schedule_taint(node())
    assert not has_prefer_no_schedule_taint(node("NoSchedule", "NoExecute"))
    assert has_prefer_no_schedule_taint(node("NoSchedule", "PreferNoSchedule"))
    assert not has_prefer_no_schedule_taint({"metadata": {"name": "n"}})
