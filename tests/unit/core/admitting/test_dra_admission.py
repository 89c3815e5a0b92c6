"""DRA mode at admission: the mutating webhook's conversion, and what a tenant may not do to it.

The mutating path (``core.admitting.draconverting``) turns a new GPU pod into a claim; the
validating webhook (``decide``) then sees the converted pod with the tenant's identity, so the
webhook's own mark (``gpushare.io/dra-requests`` beside the gate) must pass, while the same mark
without the gate, or the gate lifted by a tenant, is refused.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from gpushare.core.admitting.admission import AdmissionSettings, decide
from gpushare.core.admitting.draconverting import DraSettings, mutate_dra
from gpushare.core.admitting.tampering import TrustedWriters
from gpushare.core.model.names import ANN_DRA_REQUESTS, DRA_SCHEDULING_GATE
from gpushare.core.model.units import MemoryUnit
from tests.support.jsonpatching import patched
from tests.support.tampering import MEM, gpu_pod, refused, review

ALLOCATOR = "system:serviceaccount:gpushare:gpushare-scheduler"
SETTINGS = AdmissionSettings(trust=TrustedWriters(users=frozenset({ALLOCATOR})))


def seed_pod(**spec: Any) -> dict[str, Any]:
    pod = gpu_pod()
    pod["spec"]["containers"][0]["resources"] = {"limits": {MEM: "3"}}
    pod["spec"].update(spec)
    return pod


def converted(pod: dict[str, Any], dra: DraSettings | None = None) -> dict[str, Any]:
    mutation = mutate_dra(review(pod), SETTINGS, dra or DraSettings(), namespace_selected=True)
    assert mutation.decision.decision == "mutated", mutation.decision
    return patched(mutation.decision.review, pod)


def test_a_pod_of_a_dra_namespace_becomes_a_claim_and_its_template_is_returned() -> None:
    pod = seed_pod()
    mutation = mutate_dra(review(pod), SETTINGS, DraSettings(), namespace_selected=True)
    assert mutation.template is not None and not mutation.dry_run
    name = mutation.template["metadata"]["name"]
    assert mutation.template["metadata"]["namespace"] == "team-a"
    after = patched(mutation.decision.review, pod)
    assert after["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == name
    assert after["spec"]["containers"][0]["resources"]["limits"] == {}
    assert any(name in w for w in mutation.decision.review["response"]["warnings"])
    assert "namespace is labelled" in mutation.decision.reasons[0]


def test_the_dra_memory_unit_sets_the_capacity() -> None:
    pod = seed_pod()
    dra = DraSettings(unit=MemoryUnit.MiB128)
    mutation = mutate_dra(review(pod), SETTINGS, dra, namespace_selected=True)
    assert mutation.template is not None
    request = mutation.template["spec"]["spec"]["devices"]["requests"][0]
    assert request["exactly"]["capacity"]["requests"]["memory"] == "384Mi"


def test_a_dry_run_is_answered_but_marked_so_nothing_is_created() -> None:
    body = review(seed_pod())
    body["request"]["dryRun"] = True
    mutation = mutate_dra(body, SETTINGS, DraSettings(), namespace_selected=True)
    assert mutation.dry_run and mutation.template is not None


def test_pods_outside_dra_mode_and_bad_requests_are_left_as_written() -> None:
    outside = mutate_dra(review(seed_pod()), SETTINGS, DraSettings(), namespace_selected=False)
    assert outside.decision.decision == "allowed" and outside.template is None
    demanded = seed_pod(nodeSelector={"gpushare.io/allocation-mode": "dra"})
    assert mutate_dra(review(demanded), SETTINGS, DraSettings(), namespace_selected=False).template
    default = DraSettings(default_dra=True)
    assert mutate_dra(review(seed_pod()), SETTINGS, default, namespace_selected=False).template
    bad = seed_pod()
    bad["spec"]["containers"][0]["resources"] = {"limits": {MEM: "3Gi"}}
    left = mutate_dra(review(bad), SETTINGS, DraSettings(), namespace_selected=True)
    assert left.template is None and "patch" not in left.decision.review["response"]
    assert "validating webhook" in left.decision.reasons[0]
    # the validating webhook, after it, refuses it with the reasons of device-plugin mode
    answered = decide(review(bad), SETTINGS).review["response"]
    assert answered["allowed"] is False and answered["status"]["code"] == 422
    assert "unit suffix" in answered["status"]["message"]


def test_the_converted_pod_passes_the_validating_webhook_as_the_tenant() -> None:
    after = converted(seed_pod())
    assert ANN_DRA_REQUESTS in after["metadata"]["annotations"]
    assert decide(review(after), SETTINGS).allowed


def test_the_dra_mark_without_the_gate_is_refused() -> None:
    after = converted(seed_pod())
    del after["spec"]["schedulingGates"]
    message = refused(review(after), SETTINGS)
    assert f'metadata.annotations["{ANN_DRA_REQUESTS}"]=' in message
    assert "remove the annotation" in message


def test_a_tenant_may_not_lift_the_gate_but_the_allocator_may() -> None:
    before = converted(seed_pod())
    lifted = copy.deepcopy(before)
    lifted["spec"]["schedulingGates"] = []
    message = refused(review(lifted, "UPDATE", before), SETTINGS)
    assert f'spec.schedulingGates: the gate "{DRA_SCHEDULING_GATE}" removed by' in message
    assert "only gpushare's DRA allocator lifts it" in message
    assert "leave the gate" in message
    by_allocator = review(lifted, "UPDATE", before, user=ALLOCATOR)
    assert decide(by_allocator, SETTINGS).allowed


def test_the_mark_records_what_the_manifest_asked() -> None:
    after = converted(seed_pod())
    asked = json.loads(after["metadata"]["annotations"][ANN_DRA_REQUESTS])
    assert asked["containers"] == {"main": {MEM: 3}}
