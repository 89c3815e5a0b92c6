"""The admission decision: an AdmissionReview v1 request in, the review's response out.

A bad GPU request should fail where the user types it, at ``kubectl apply``, rather than as a
pod that stays Pending with a filter reason. So the webhook checks pods and every workload that
carries a pod template (Job, CronJob, Deployment, StatefulSet, DaemonSet, ReplicaSet,
ReplicationController) with the very rules the extender's filter applies
(``core.model.requests.read_pod``), so the two can never disagree. It also refuses what only
gpushare
may write into a pod (``core.admitting.tampering``: hand-off annotations, the isolation's variables,
``nodeName`` on GPU pods), which no later stage can tell from the truth.

Outcomes are values: a ``Decision`` holds the response document and a summary for metrics.

- Tampering is denied with 403 (``Forbidden``), every reason at once, each naming the field path,
  the value, the rule and what to do; an invalid GPU request in the same object is named too.
- A GPU request the core rejects is denied with 422 (``Invalid``); the message names the object,
  the pod template's path and, per reason, the container, field, value, rule and what to write.
- A request that is not an AdmissionReview v1 (or an object the webhook cannot read) is denied
  with 400 and says what was wrong: a denial that explains beats a crash that the API server
  turns into its failure policy.
- A pod template asking for GPU memory without ``schedulerName: ack-co-scheduler`` is allowed
  with a warning, because clusters that wire the extender into every profile still place it.
  When its pods will be given that name (``mutate``, below), the warning says so instead.
- An UPDATE judges only what it changes: an invalid request or a refused variable that
  ``oldObject`` already had is allowed with a warning (refusing it would block removing a
  finalizer from a pod created before the webhook, and it makes nothing worse). The
  ``ephemeralcontainers`` subresource arrives as an UPDATE of the whole Pod and is read the same.
- Everything else (no GPU resource, DELETE, CONNECT, other kinds) is allowed untouched.

``mutate`` answers the mutating webhook: a Pod created with a gpushare GPU request and no
scheduler named gets ``spec.schedulerName: ack-co-scheduler`` (``AdmissionSettings.steer_from``),
so that manifests written for ACK, where the seeds' cuda-sample, the 128 MiB StatefulSet and
tensorflow-mnist-share name no scheduler, reach gpushare unchanged. The API server fills in
``default-scheduler`` before admission when the field is empty (``SetDefaults_PodSpec`` in
``pkg/apis/core/v1/defaults.go``), so that name is what "none named" looks like here; a pod that
writes ``default-scheduler`` itself cannot be told apart and is steered too (set
``steer_from`` to ``()`` to turn steering off). Only Pods are patched, never workload templates:
a patched Deployment template would differ from what its owner applied, and every pod a
controller creates passes this webhook anyway. A pod the validating webhook refuses (an invalid
request, ``nodeName`` set) is left as it is for that refusal.

Where GPU nodes are tainted (GKE's ``nvidia.com/gpu``), ``mutate`` also gives the GPU pods it
sees the tolerations listed in ``AdmissionSettings.steer_tolerations`` that they lack
(``core.admitting.tolerations``): the pods it steers, and pods that name gpushare's scheduler
themselves (the steering configuration sends those too when tolerations are listed).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from gpushare.core.admitting import tolerations
from gpushare.core.admitting.tampering import (
    Checked,
    Requester,
    Tampering,
    TrustedWriters,
    VisibleDevicesRule,
    check,
)
from gpushare.core.model.names import (
    DEFAULT_NAMES,
    DEFAULT_SCHEDULER,
    SCHEDULER_NAME,
    ResourceNames,
)
from gpushare.core.model.requests import PodRequest, Rejection, read_pod
from gpushare.core.model.shape import pod_shape
from gpushare.core.model.units import MemoryUnit

API_VERSION = "admission.k8s.io/v1"

DecisionKind = Literal["allowed", "warned", "denied", "malformed", "mutated"]

TEMPLATE_PATHS: Mapping[str, tuple[str, ...]] = {
    "Pod": (),
    "Job": ("spec", "template"),
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "ReplicationController": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}
"""Where each kind keeps its pod (template); the webhook's rules list the same kinds."""


@dataclass(frozen=True)
class AdmissionSettings:
    """What the decision depends on: names, the unit, the scheduler and whose writes pass."""

    names: ResourceNames = DEFAULT_NAMES
    unit: MemoryUnit = MemoryUnit.GiB
    scheduler_name: str = SCHEDULER_NAME
    trust: TrustedWriters = field(default_factory=TrustedWriters)
    """The extender's and device plugin's identities (``--trusted-user``); none by default."""
    steer_from: tuple[str, ...] = (DEFAULT_SCHEDULER,)
    """Scheduler names that count as none named: ``mutate`` replaces them on GPU pods."""
    steer_tolerations: tuple[tolerations.Toleration, ...] = ()
    """Tolerations ``mutate`` adds to the GPU pods it sees that lack them (tainted GPU pools)."""
    visible_devices: VisibleDevicesRule = field(default_factory=VisibleDevicesRule)
    """Where ``NVIDIA_VISIBLE_DEVICES`` is refused; by default everywhere but the exempt
    namespaces (``gpushare webhook`` and the chart resolve it from their settings)."""


@dataclass(frozen=True)
class Decision:
    """The AdmissionReview to send back, and what it decided (for metrics and logs)."""

    review: dict[str, Any]
    kind: str
    """The admitted kind (``Job``); ``other`` for kinds not read, ``unknown`` if unreadable."""
    decision: DecisionKind
    reasons: tuple[str, ...] = field(default=())
    user: str = ""
    """Who asked (``request.userInfo.username``), so a refused forgery is logged with its author."""

    @property
    def allowed(self) -> bool:
        """Whether the API server may store the object."""
        return bool(self.review["response"]["allowed"])


def _response(
    uid: str,
    *,
    allowed: bool,
    code: int = 200,
    reason: str = "",
    message: str = "",
    warnings: Sequence[str] = (),
) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if not allowed:
        response["status"] = {"code": code, "reason": reason, "message": message}
    if warnings:
        response["warnings"] = list(warnings)
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}


def malformed(uid: str, kind: str, problem: str) -> Decision:
    """Deny a request that cannot be read, saying what was wrong with it."""
    message = f"gpushare cannot read this admission request: {problem}"
    review = _response(uid, allowed=False, code=400, reason="BadRequest", message=message)
    return Decision(review=review, kind=kind, decision="malformed", reasons=(problem,))


def _template(obj: Mapping[str, Any], path: tuple[str, ...]) -> tuple[Any, str]:
    """The pod or pod template inside ``obj``, and its path; (None, path) when absent."""
    node: Any = obj
    walked: list[str] = []
    for key in path:
        walked.append(key)
        if not isinstance(node, Mapping) or node.get(key) is None:
            return None, ".".join(walked)
        node = node[key]
    return node, ".".join(path)


def _read(
    obj: Mapping[str, Any], kind: str, settings: AdmissionSettings
) -> tuple[PodRequest | Rejection | None, str, str]:
    """(request or rejection or None when there is no pod template, its path, a shape problem)."""
    template, where = _template(obj, TEMPLATE_PATHS[kind])
    if template is None:
        return None, where, ""
    shape = pod_shape(template)
    if shape:
        return None, where, shape.message(where)
    spec_path = f"{where}.spec" if where else "spec"
    read = read_pod(template, names=settings.names, unit=settings.unit, spec_path=spec_path)
    return read, where, ""


def _scheduler_warning(template: Mapping[str, Any], where: str, settings: AdmissionSettings) -> str:
    spec = template.get("spec") or {}
    scheduler = spec.get("schedulerName")
    if scheduler == settings.scheduler_name:
        return ""
    field_path = f"{where}.spec.schedulerName" if where else "spec.schedulerName"
    shown = f"is {scheduler!r}" if scheduler else f"is not set ({DEFAULT_SCHEDULER})"
    if _steered(scheduler, settings):
        return (
            f"{field_path} {shown}; its pods ask for {settings.names.mem}, so gpushare's "
            f"mutating webhook gives each of them schedulerName: {settings.scheduler_name} "
            f"when it is created"
        )
    return (
        f"{field_path} {shown} but the pod asks for {settings.names.mem}; set schedulerName: "
        f"{settings.scheduler_name}, or the pod is placed by a scheduler that may not know "
        f"shared GPUs"
    )


def _steered(scheduler: object, settings: AdmissionSettings) -> bool:
    """Whether a pod naming this scheduler (None or "": none) is given gpushare's."""
    if not settings.steer_from or scheduler == settings.scheduler_name:
        return False
    return not scheduler or scheduler in settings.steer_from


def _kind_of(request: Mapping[str, Any]) -> str:
    """The reviewed object's kind ("" when the request does not say)."""
    gvk = request.get("kind")
    return str(gvk.get("kind") or "") if isinstance(gvk, Mapping) else ""


def _object_name(obj: Mapping[str, Any], request: Mapping[str, Any]) -> str:
    raw = obj.get("metadata")
    metadata: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    name = str(metadata.get("name") or request.get("name") or "")
    if not name and metadata.get("generateName"):
        name = f"{metadata['generateName']}*"
    namespace = str(request.get("namespace") or metadata.get("namespace") or "")
    return f"{namespace}/{name}" if namespace else name


def _envelope(body: Any) -> tuple[Mapping[str, Any], str] | Decision:
    """The review's request and uid, or the malformed Decision saying what is wrong."""
    if not isinstance(body, Mapping):
        return malformed("", "unknown", f"the body is {type(body).__name__}, not an object")
    request = body.get("request")
    uid = str(request.get("uid") or "") if isinstance(request, Mapping) else ""
    if body.get("apiVersion") != API_VERSION or body.get("kind") != "AdmissionReview":
        return malformed(
            uid,
            "unknown",
            f"apiVersion={body.get('apiVersion')!r} kind={body.get('kind')!r}; expected "
            f"apiVersion {API_VERSION} kind AdmissionReview "
            f"(set admissionReviewVersions: [v1] in the webhook configuration)",
        )
    if not isinstance(request, Mapping) or not uid:
        return malformed(uid, "unknown", "request or request.uid is missing")
    return request, uid


def decide(body: Any, settings: AdmissionSettings | None = None) -> Decision:
    """Answer one validating AdmissionReview v1 request (any JSON value) with its response."""
    settings = settings or AdmissionSettings()
    read = _envelope(body)
    if isinstance(read, Decision):
        return read
    request, uid = read
    decision = _decide(request, uid, settings)
    return replace(decision, user=Requester.from_user_info(request.get("userInfo")).username)


def mutate(body: Any, settings: AdmissionSettings | None = None) -> Decision:
    """Answer one mutating AdmissionReview v1 request: steer a GPU pod to gpushare's scheduler.

    Never denies a readable review: whatever is wrong with the pod is the validating webhook's
    to refuse, with its reasons, after this one has run.
    """
    settings = settings or AdmissionSettings()
    read = _envelope(body)
    if isinstance(read, Decision):
        return read
    request, uid = read
    user = Requester.from_user_info(request.get("userInfo")).username
    kind = _kind_of(request)
    untouched = Decision(
        review=_response(uid, allowed=True),
        kind=kind if kind in TEMPLATE_PATHS else "other",
        decision="allowed",
        user=user,
    )
    obj = request.get("object")
    if kind != "Pod" or request.get("operation") != "CREATE" or not isinstance(obj, Mapping):
        return untouched
    spec = obj.get("spec")
    if not isinstance(spec, Mapping) or spec.get("nodeName"):
        return untouched
    scheduler = spec.get("schedulerName")
    steered = _steered(scheduler, settings)
    named = scheduler == settings.scheduler_name and bool(settings.steer_from)
    if not steered and not (named and settings.steer_tolerations):
        return untouched
    pod, _, problem = _read(obj, kind, settings)
    if problem or not isinstance(pod, PodRequest) or not pod.wants_gpu:
        return untouched
    patch: list[dict[str, Any]] = []
    warnings: list[str] = []
    if steered:
        shown = repr(scheduler) if scheduler else "not set"
        warnings.append(
            f"Pod {_object_name(obj, request)}: spec.schedulerName was {shown}; gpushare set it "
            f"to {settings.scheduler_name!r} because the pod asks for {settings.names.mem} "
            f"(another scheduler would not place it on a shared GPU)"
        )
        patch.append({"op": "add", "path": "/spec/schedulerName", "value": settings.scheduler_name})
    added = tolerations.missing(spec.get("tolerations"), settings.steer_tolerations)
    if added:
        shown_added = ", ".join(json.dumps(t.as_json(), sort_keys=True) for t in added)
        warnings.append(
            f"Pod {_object_name(obj, request)}: gpushare added the toleration(s) {shown_added} "
            f"that the cluster's GPU nodes need (the webhook's --steer-toleration)"
        )
        patch += tolerations.patch(spec.get("tolerations"), added)
    if not patch:
        return untouched
    review = _response(uid, allowed=True, warnings=warnings)
    review["response"]["patchType"] = "JSONPatch"
    review["response"]["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return Decision(
        review=review, kind=kind, decision="mutated", reasons=tuple(warnings), user=user
    )


def _decide(request: Mapping[str, Any], uid: str, settings: AdmissionSettings) -> Decision:
    kind = _kind_of(request) or "unknown"
    operation = request.get("operation")
    if kind not in TEMPLATE_PATHS:  # "other" keeps the metrics' kind label bounded
        return Decision(review=_response(uid, allowed=True), kind="other", decision="allowed")
    if operation not in ("CREATE", "UPDATE"):
        return Decision(review=_response(uid, allowed=True), kind=kind, decision="allowed")
    obj = request.get("object")
    if not isinstance(obj, Mapping):
        return malformed(uid, kind, f"request.object of the {operation} is missing")
    read, where, problem = _read(obj, kind, settings)
    if problem:
        return malformed(uid, kind, f"{kind} {_object_name(obj, request)}: {problem}")
    if read is None:
        return Decision(review=_response(uid, allowed=True), kind=kind, decision="allowed")
    template, _ = _template(obj, TEMPLATE_PATHS[kind])
    label = f"{kind} {_object_name(obj, request)}"
    if where:
        label += f" (pod template {where})"
    old = request.get("oldObject") if operation == "UPDATE" else None
    tampering = _tampering(template, where, kind, old, request, settings)
    rejection = read if isinstance(read, Rejection) else None
    kept_rejection = rejection is not None and _same_rejection(old, kind, rejection, settings)
    if tampering.refused:
        message = f"{label} is refused: {'; '.join(tampering.refused)}"
        reasons = tampering.refused
        if rejection is not None and not kept_rejection:
            message += (
                f"; it also asks for GPU resources gpushare cannot place: {rejection.message}"
            )
            reasons += rejection.reasons
        review = _response(uid, allowed=False, code=403, reason="Forbidden", message=message)
        return Decision(review=review, kind=kind, decision="denied", reasons=reasons)
    warnings = [
        f"{label} keeps what gpushare refuses in a new one: {kept}" for kept in tampering.kept
    ]
    if rejection is not None:
        if kept_rejection:
            warnings.insert(
                0, f"{label} keeps a GPU request gpushare cannot place: {rejection.message}"
            )
            review = _response(uid, allowed=True, warnings=warnings)
            return Decision(review=review, kind=kind, decision="warned", reasons=rejection.reasons)
        message = f"{label} asks for GPU resources gpushare cannot place: {rejection.message}"
        review = _response(uid, allowed=False, code=422, reason="Invalid", message=message)
        return Decision(review=review, kind=kind, decision="denied", reasons=rejection.reasons)
    assert isinstance(read, PodRequest)
    scheduler = _scheduler_warning(template, where, settings) if read.wants_gpu else ""
    if scheduler:
        warnings.insert(0, scheduler)
    if warnings:
        review = _response(uid, allowed=True, warnings=warnings)
        return Decision(review=review, kind=kind, decision="warned", reasons=tuple(warnings))
    return Decision(review=_response(uid, allowed=True), kind=kind, decision="allowed")


def _tampering(
    template: Mapping[str, Any],
    where: str,
    kind: str,
    old: Any,
    request: Mapping[str, Any],
    settings: AdmissionSettings,
) -> Tampering:
    """What the object newly sets that only gpushare may write (``core.admitting.tampering``).

    An ``oldObject`` that cannot be read counts as absent, so the UPDATE is judged as strictly
    as a CREATE.
    """
    old_template = None
    if isinstance(old, Mapping):
        found, _ = _template(old, TEMPLATE_PATHS[kind])
        if isinstance(found, Mapping) and not pod_shape(found):
            old_template = found
    checked = Checked(
        template=template,
        where=where,
        is_pod=kind == "Pod",
        old=old_template,
        requester=Requester.from_user_info(request.get("userInfo")),
        namespace=_namespace(request),
    )
    return check(
        checked,
        names=settings.names,
        trust=settings.trust,
        scheduler_name=settings.scheduler_name,
        visible_devices=settings.visible_devices,
    )


def _namespace(request: Mapping[str, Any]) -> str:
    """The namespace the object lives in: the request's, as the API server routed it.

    The object's own ``metadata.namespace`` may be empty in the review (a Pod created with
    ``generateName`` from a manifest without one); ``request.namespace`` never is for a
    namespaced kind, so it comes first.
    """
    namespace = request.get("namespace")
    if isinstance(namespace, str) and namespace:
        return namespace
    obj = request.get("object")
    metadata = obj.get("metadata") if isinstance(obj, Mapping) else None
    found = metadata.get("namespace") if isinstance(metadata, Mapping) else None
    return found if isinstance(found, str) else ""


def _same_rejection(old: Any, kind: str, new: Rejection, settings: AdmissionSettings) -> bool:
    """Whether the object before the UPDATE was already refused for (at least) these reasons."""
    if not isinstance(old, Mapping):
        return False
    read, _, problem = _read(old, kind, settings)
    return not problem and isinstance(read, Rejection) and set(new.reasons) <= set(read.reasons)
