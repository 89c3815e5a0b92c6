"""The mutating webhook's DRA path: an AdmissionReview for a new Pod in, the conversion out.

``core.dra.claims`` says what a pod's ACK resources become; this module answers the review: the
JSON patch for the pod, the ResourceClaimTemplate the adapter must create in the pod's namespace
before it answers (the API server then validates the pod's claim reference, and
kube-controller-manager makes the pod's claim from it), and whether the request is a dry run
(``sideEffects: NoneOnDryRun``: then nothing is created, the patch is still answered).

Which pods reach it is the API server's choice first (docs/dra.md "Which pods"): the chart sends
pods of namespaces labelled ``gpushare.io/allocation-mode=dra`` to ``/mutate-dra-namespace``
(``namespace_selected``), and every other new GPU pod to ``/mutate-dra`` when the cluster's
default mode is DRA, or when its node selector names the label; the pod's required node affinity
is read here (``core.dra.claims.selection``).

Like ``admission.mutate`` it never denies a readable review for what the pod asks: a request the
core refuses is left as written, and the validating webhook, which runs after every mutating one,
refuses it with the same reasons as in device-plugin mode.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from gpushare.core.admitting import tolerations
from gpushare.core.admitting.admission import (
    AdmissionSettings,
    Decision,
    _envelope,
    _kind_of,
    _object_name,
    _response,
)
from gpushare.core.admitting.tampering import Requester
from gpushare.core.dra.claims import Conversion, Untouched, convert, selection
from gpushare.core.model.requests import Rejection
from gpushare.core.model.units import MemoryUnit


@dataclass(frozen=True)
class DraSettings:
    """DRA mode's settings for the webhook (the chart's ``dra.*``)."""

    unit: MemoryUnit = MemoryUnit.GiB
    """``dra.memoryUnit``: what one ``aliyun.com/gpu-mem`` counts in DRA mode."""
    default_dra: bool = False
    """``dra.defaultMode: dra``: every GPU pod outside the skipped namespaces is converted."""
    gate: bool = True
    """Put the scheduling gate on converted pods (off only where gpushare's allocator does not
    run, so the stock allocator places them)."""


@dataclass(frozen=True)
class DraMutation:
    """The answer, and the template the adapter creates before sending it (None: nothing)."""

    decision: Decision
    template: dict[str, Any] | None = None
    dry_run: bool = False


def mutate_dra(
    body: Any,
    settings: AdmissionSettings,
    dra: DraSettings,
    *,
    namespace_selected: bool,
) -> DraMutation:
    """Answer one mutating review on the DRA path: convert a new GPU pod in DRA mode."""
    read = _envelope(body)
    if isinstance(read, Decision):
        return DraMutation(read)
    request, uid = read
    user = Requester.from_user_info(request.get("userInfo")).username
    kind = _kind_of(request)

    def untouched(reason: str) -> DraMutation:
        decision = Decision(
            review=_response(uid, allowed=True),
            kind=kind if kind == "Pod" else "other",
            decision="allowed",
            reasons=(reason,) if reason else (),
            user=user,
        )
        return DraMutation(decision)

    obj = request.get("object")
    if kind != "Pod" or request.get("operation") != "CREATE" or not isinstance(obj, dict):
        return untouched("")
    spec = obj.get("spec")
    if not isinstance(spec, dict) or spec.get("nodeName"):
        return untouched("")
    why = selection(obj, namespace_selected=namespace_selected, default_dra=dra.default_dra)
    if not why:
        return untouched("not in DRA mode")
    pod = obj
    if not (obj.get("metadata") or {}).get("namespace") and request.get("namespace"):
        metadata = {**(obj.get("metadata") or {}), "namespace": request["namespace"]}
        pod = {**obj, "metadata": metadata}
    outcome = convert(pod, unit=dra.unit, names=settings.names, gate=dra.gate)
    if isinstance(outcome, Rejection):
        return untouched(f"left for the validating webhook to refuse: {outcome.message}")
    if isinstance(outcome, Untouched):
        return untouched(outcome.reason)
    return DraMutation(
        _converted(uid, kind, user, obj, request, outcome, why, settings),
        template=outcome.template,
        dry_run=bool(request.get("dryRun")),
    )


def _converted(
    uid: str,
    kind: str,
    user: str,
    obj: dict[str, Any],
    request: Any,
    outcome: Conversion,
    why: str,
    settings: AdmissionSettings,
) -> Decision:
    patch = list(outcome.patch)
    warning = (
        f"Pod {_object_name(obj, request)}: gpushare turned its {settings.names.mem} request into "
        f"the DRA claim {outcome.template_name!r} ({why}); the annotation "
        f"gpushare.io/dra-requests keeps what the manifest asked"
    )
    warnings = [warning]
    spec = obj.get("spec") or {}
    added = tolerations.missing(spec.get("tolerations"), settings.steer_tolerations)
    if added:
        shown = ", ".join(json.dumps(t.as_json(), sort_keys=True) for t in added)
        warnings.append(
            f"Pod {_object_name(obj, request)}: gpushare added the toleration(s) {shown} "
            f"that the cluster's GPU nodes need (the webhook's --steer-toleration)"
        )
        patch += tolerations.patch(spec.get("tolerations"), added)
    review = _response(uid, allowed=True, warnings=warnings)
    review["response"]["patchType"] = "JSONPatch"
    review["response"]["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    reasons = tuple(warnings)
    return Decision(review=review, kind=kind, decision="mutated", reasons=reasons, user=user)


def refused(mutation: DraMutation, problem: str) -> Decision:
    """The pod refused because its template could not be made: it would wait for a claim
    kube-controller-manager cannot create."""
    response = mutation.decision.review["response"]
    message = (
        f"gpushare could not create the ResourceClaimTemplate this pod's DRA claim comes from: "
        f"{problem}; create the pod again (the webhook retries), or ask the cluster admin to "
        f"check the webhook's RBAC (resourceclaimtemplates create, get)"
    )
    review = _response(
        str(response.get("uid", "")),
        allowed=False,
        code=500,
        reason="InternalError",
        message=message,
    )
    return Decision(
        review=review,
        kind=mutation.decision.kind,
        decision="denied",
        reasons=(problem,),
        user=mutation.decision.user,
    )
