"""Trust: only gpushare's own writes count.

A pod's annotations are written by whoever may update the pod, and a tenant who can create pods
in their own namespace can write any ``gpushare.io/allocation`` they like, naming any node and
any GPU. Read at face value, such a record fills another tenant's GPUs in the ledger, and on the
node it reaches the device plugin's hand-off, where kubelet's ``Allocate`` (device IDs only, no
pod) would serve it, or serve its pod another pod's answer. So every reader judges an allocation
before it counts, with the same rules:

1. its seal verifies: ``gpushare.io/seal`` is an HMAC-SHA256 (base64url) that the extender
   writes at bind, with a key only gpushare's components hold, over a canonical, versioned
   message of the pod's UID, namespace and name, the node, and the allocation record exactly
   as written. kube-apiserver assigns the UID, so a seal copied onto another pod, even one of
   the same name, does not verify;
2. once the pod is bound, ``spec.nodeName`` is the node the allocation names (a pod created
   with ``nodeName`` cannot borrow an allocation for another node);
3. the allocation is what the pod's own requests plan to (containers, their names and sizes,
   computing power, ``aliyun.com/gpu-count``), so no record holds more or less than its pod.

A sealed allocation on a pod not bound yet counts: that is the window between bind's annotation
write and its binding. The extender's in-memory assumptions are its own and are not judged.

Without a key (``kubectl inspect cgpu`` that cannot read the Secret, or a component started with
``--insecure-no-seal``) only rules 2 and 3 apply, which stops records that do not fit their pod
but not a ``nodeName`` pod whose record matches its own request. A ``Trust`` with neither a key
nor that explicit choice ignores every record: forgetting the key never means trusting all.

An ignored allocation is a value with a reason, never an exception; the pod then holds what any
pod holds that gpushare did not place (core.booking.ledger: on its node as a whole, once bound).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from gpushare.core.model.kubejson import (
    TERMINAL_PHASES,
    KubeObject,
    annotations_of,
    key_of,
    labels_of,
    name_of,
    namespace_of,
    node_name_of,
    pod_spec_of,
    pod_status_of,
    uid_of,
)
from gpushare.core.model.names import (
    ANN_ALLOCATION,
    ANN_IDX,
    ANN_POD,
    ANN_SEAL,
    DEFAULT_NAMES,
    LABEL_POD_GPU_COUNT,
    ResourceNames,
)
from gpushare.core.model.quantity import Quantity, parse_quantity
from gpushare.core.model.requests import Rejection, read_pod
from gpushare.core.records.allocation import Allocation, ContainerShare, from_pod, plan
from gpushare.core.records.handoff import CORE, MEM, Stranger

SEAL_VERSION = 1
SEAL_PREFIX = f"v{SEAL_VERSION}."
"""Seals start with their message's version, so a later format can be told apart."""
MIN_KEY_BYTES = 16
"""Shorter keys are refused: the chart makes 32 random bytes, ``gpushare seal-key`` 256 bits."""


@dataclass(frozen=True)
class SealKey:
    """The secret every gpushare component shares; its bytes never appear in a repr."""

    secret: bytes = field(repr=False)


def read_key(data: bytes, *, where: str) -> SealKey | str:
    """The key in a file's or Secret's bytes (surrounding whitespace dropped), or why not.

    Whitespace is dropped so a key written with a trailing newline and the same key pasted
    into a Secret without one agree.
    """
    secret = data.strip()
    if len(secret) < MIN_KEY_BYTES:
        return (
            f"{where} holds {len(secret)} byte(s); a seal key needs at least {MIN_KEY_BYTES}: "
            f"make one with `gpushare seal-key > seal.key` or `head -c32 /dev/urandom > seal.key`"
        )
    return SealKey(secret)


def seal_message(*, uid: str, namespace: str, name: str, node: str, record: str) -> bytes:
    """What a seal signs: a JSON array, so no field can run into the next one."""
    fields = ["gpushare.io/seal", SEAL_VERSION, uid, namespace, name, node, record]
    return json.dumps(fields, separators=(",", ":"), ensure_ascii=True).encode()


def seal(key: SealKey, *, uid: str, namespace: str, name: str, node: str, record: str) -> str:
    """The ``gpushare.io/seal`` value for one pod's allocation record."""
    message = seal_message(uid=uid, namespace=namespace, name=name, node=node, record=record)
    digest = hmac.new(key.secret, message, hashlib.sha256).digest()
    return SEAL_PREFIX + base64.urlsafe_b64encode(digest).decode().rstrip("=")


def seal_matches(
    key: SealKey, text: str, *, uid: str, namespace: str, name: str, node: str, record: str
) -> bool:
    """Whether a seal was made with this key for exactly these fields (constant time)."""
    expected = seal(key, uid=uid, namespace=namespace, name=name, node=node, record=record)
    return hmac.compare_digest(expected.encode(), text.encode())


class Reason(Enum):
    """Why an allocation is ignored; the value is the metrics label."""

    NO_KEY = "no_key"
    NO_SEAL = "no_seal"
    SEAL_MISMATCH = "seal_mismatch"
    WRONG_NODE = "wrong_node"
    REQUESTS = "requests_mismatch"


@dataclass(frozen=True)
class Trusted:
    """The allocation counts."""


TRUSTED = Trusted()


@dataclass(frozen=True)
class Ignored:
    """The allocation does not count, and why, in words a tenant can act on."""

    reason: Reason
    message: str


Judgement = Trusted | Ignored


@dataclass(frozen=True)
class Trust:
    """How allocations are judged: with a key, by structure only, or (no key) not at all."""

    key: SealKey | None = None
    structure_only: bool = False
    """Without a key: check node and requests only (an explicit, insecure choice)."""

    @classmethod
    def sealed(cls, key: SealKey) -> Trust:
        """Check seals with this key, then structure."""
        return cls(key=key)

    @classmethod
    def structural(cls) -> Trust:
        """Check node and requests only: for a reader that has no key."""
        return cls(structure_only=True)

    @property
    def checks_seals(self) -> bool:
        """Whether a seal is required (and verified when there is a key)."""
        return not (self.key is None and self.structure_only)

    def seal_for(self, allocation: Allocation, record: str) -> str:
        """The seal bind writes beside ``record``; empty when there is no key to make one."""
        if self.key is None:
            return ""
        return seal(
            self.key,
            uid=allocation.uid,
            namespace=allocation.namespace,
            name=allocation.name,
            node=allocation.node,
            record=record,
        )

    def judge(
        self, pod: KubeObject, allocation: Allocation, *, names: ResourceNames = DEFAULT_NAMES
    ) -> Judgement:
        """Whether the allocation read from this pod's annotations counts (rules 1-3 above)."""
        if self.checks_seals:
            failed = self._seal_failure(pod, allocation)
            if failed is not None:
                return failed
        bound = node_name_of(pod)
        if bound and bound != allocation.node:
            return Ignored(
                Reason.WRONG_NODE, f"bound to node {bound}, allocation names {allocation.node}"
            )
        mismatch = requests_mismatch(pod, allocation, names=names)
        if mismatch is not None:
            return Ignored(
                Reason.REQUESTS, f"allocation does not match the pod's requests: {mismatch}"
            )
        return TRUSTED

    def _seal_failure(self, pod: KubeObject, allocation: Allocation) -> Ignored | None:
        if self.key is None:
            return Ignored(Reason.NO_KEY, "no seal key is configured here to check its seal")
        annotations = annotations_of(pod)
        record = annotations.get(ANN_ALLOCATION)
        text = annotations.get(ANN_SEAL)
        if not isinstance(record, str) or not isinstance(text, str) or not text:
            return Ignored(Reason.NO_SEAL, "no seal")
        fields = {
            "uid": uid_of(pod),
            "namespace": namespace_of(pod),
            "name": name_of(pod),
            "node": allocation.node,
        }
        if not seal_matches(self.key, text, record=record, **fields):
            return Ignored(Reason.SEAL_MISMATCH, "seal does not match")
        return None


_Key = tuple[object, ...]


def _depends_on(pod: KubeObject) -> _Key:
    """What a judgement reads that can change while the pod keeps its UID.

    Namespace, name and the containers' limits cannot change (extended resources are not
    resizable in place); annotations, the node and labels can.
    """
    annotations = annotations_of(pod)
    return (
        annotations.get(ANN_ALLOCATION),
        annotations.get(ANN_SEAL),
        annotations.get(ANN_IDX),
        annotations.get(ANN_POD),
        node_name_of(pod),
        labels_of(pod).get(LABEL_POD_GPU_COUNT),
    )


class Judged:
    """Judgements remembered per pod UID while what they depend on stays the same.

    A pod changes many times after its allocation is written (binding, status, the served
    mark), and a relist sees every pod again; none of that changes the judgement, so the
    seal is verified and the request read once per pod and record, not once per event.
    """

    def __init__(self, trust: Trust, names: ResourceNames = DEFAULT_NAMES) -> None:
        self.trust = trust
        self.names = names
        self._by_uid: dict[str, tuple[_Key, Judgement]] = {}

    def judge(self, pod: KubeObject, allocation: Allocation) -> Judgement:
        """``Trust.judge``, remembered."""
        uid = uid_of(pod)
        key = _depends_on(pod)
        hit = self._by_uid.get(uid)
        if hit is not None and hit[0] == key:
            return hit[1]
        judgement = self.trust.judge(pod, allocation, names=self.names)
        self._by_uid[uid] = (key, judgement)
        return judgement

    def forget(self, uid: str) -> None:
        """Drop a pod that is gone."""
        self._by_uid.pop(uid, None)

    def retain(self, uids: Iterable[str]) -> None:
        """Keep only these pods (after a full list)."""
        keep = set(uids)
        for uid in [u for u in self._by_uid if u not in keep]:
            del self._by_uid[uid]


def _described(containers: Iterable[ContainerShare]) -> str:
    parts = []
    for c in containers:
        gpus = ",".join(f"GPU{s.index}:{s.mem_units}" for s in c.gpus)
        core = "".join(f" {s.core_pct}%" for s in c.gpus if s.core_pct)
        parts.append(f"{c.name or '?'} ({c.kind.value}) {gpus}{core}")
    return "; ".join(parts) or "no containers"


def requests_mismatch(
    pod: KubeObject, allocation: Allocation, *, names: ResourceNames = DEFAULT_NAMES
) -> str | None:
    """How the allocation differs from what the pod's own requests plan to; None if not.

    Amounts are counts of the allocation's unit, as the limits are.
    """
    request = read_pod(pod, names=names, unit=allocation.unit)
    if isinstance(request, Rejection):
        return f"the pod's request is invalid ({request.message})"
    if not request.wants_gpu:
        return f"the pod asks for no {names.mem}"
    if len(allocation.gpus) != request.gpu_count:
        return (
            f"the pod asks for {request.gpu_count} GPU(s) ({LABEL_POD_GPU_COUNT}), the "
            f"allocation holds {len(allocation.gpus)}"
        )
    if not allocation.containers:  # the predecessor's keys carry the pod's total only
        if allocation.mem_units != request.mem_units:
            return (
                f"the pod asks for {request.mem_units} units, the allocation holds "
                f"{allocation.mem_units}"
            )
        return None
    expected = plan(request, node=allocation.node, indexes=allocation.indexes, unit=allocation.unit)
    if expected.containers != allocation.containers:
        return (
            f"the pod's containers plan to {_described(expected.containers)}, the allocation "
            f"names {_described(allocation.containers)}"
        )
    if expected.gpus != allocation.gpus:
        held = ", ".join(f"GPU{s.index}:{s.mem_units}" for s in allocation.gpus)
        planned = ", ".join(f"GPU{s.index}:{s.mem_units}" for s in expected.gpus)
        return f"the pod holds {planned}, the allocation names {held}"
    return None


def has_started(pod: KubeObject) -> bool:
    """Whether kubelet has admitted the pod: it reports a phase past Pending or any container.

    A pod kubelet refuses at admission turns Failed; one it admits gets container statuses.
    """
    status = pod_status_of(pod)
    if str(status.get("phase") or "Pending") != "Pending":
        return True
    return bool(status.get("containerStatuses") or status.get("initContainerStatuses"))


def _device_count(raw: object) -> int:
    """Devices kubelet asks for when a limit says ``raw`` (``quantity.Value()``, rounded up)."""
    parsed = parse_quantity(raw)
    if not isinstance(parsed, Quantity) or parsed.value <= 0:
        return 0
    return math.ceil(parsed.value)


def device_counts(
    pod: KubeObject, *, names: ResourceNames = DEFAULT_NAMES
) -> frozenset[tuple[str, int]]:
    """(resource, device count) of each container's ``Allocate``, read leniently from limits.

    Not validated like ``read_pod``: a request gpushare would refuse still reaches kubelet, and
    kubelet asks for devices all the same.
    """
    spec = pod_spec_of(pod)
    out: set[tuple[str, int]] = set()
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        if not isinstance(container, Mapping):
            continue
        limits = (container.get("resources") or {}).get("limits") or {}
        for resource, key in ((MEM, names.mem), (CORE, names.core)):
            count = _device_count(limits.get(key)) if key in limits else 0
            if count:
                out.add((resource, count))
    return frozenset(out)


@dataclass(frozen=True)
class NodePods:
    """The live pods bound to one node, sorted the way the device plugin needs them."""

    allocations: tuple[Allocation, ...] = ()
    """Trusted allocations: the only ones served, marked served or part of the hand-off."""
    strangers: tuple[Stranger, ...] = ()
    """Pods asking for shared-GPU devices, not started, without a trusted allocation."""
    ignored: tuple[tuple[KubeObject, Ignored], ...] = ()
    """Every pod whose allocation was ignored, with why (for metrics)."""


def sort_node_pods(
    pods: Iterable[KubeObject],
    *,
    node: str,
    trust: Trust | Judged,
    names: ResourceNames = DEFAULT_NAMES,
) -> NodePods:
    """Judge every live pod bound to ``node``: trusted allocations, strangers, ignored ones.

    ``trust`` may be a ``Judged`` (then its names are used) to remember judgements.
    """
    judged = trust if isinstance(trust, Judged) else Judged(trust, names)
    names = judged.names
    allocations: list[Allocation] = []
    strangers: list[Stranger] = []
    ignored: list[tuple[KubeObject, Ignored]] = []
    for pod in _live_on(pods, node):
        allocation = from_pod(pod)
        why = "it carries no gpushare allocation"
        if allocation is not None:
            judgement = judged.judge(pod, allocation)
            if isinstance(judgement, Trusted):
                allocations.append(allocation)
                continue
            ignored.append((pod, judgement))
            why = f"its allocation is ignored: {judgement.message}"
        counts = device_counts(pod, names=names)
        if counts and not has_started(pod):
            key = key_of(pod)
            strangers.append(Stranger(uid=uid_of(pod), pod=key, reason=why, counts=counts))
    return NodePods(tuple(allocations), tuple(strangers), tuple(ignored))


def _live_on(pods: Iterable[KubeObject], node: str) -> Iterator[KubeObject]:
    for pod in pods:
        if node_name_of(pod) == node and pod_status_of(pod).get("phase") not in TERMINAL_PHASES:
            yield pod


@dataclass(frozen=True)
class Report:
    """What to do about one ignored allocation seen again."""

    count: bool
    """First time this pod is ignored for this reason: add one to the counter."""
    tell: bool
    """First time this pod is ignored at all: say so on the pod (one Event per UID)."""


class IgnoredOnce:
    """Remembers which pods were reported, so counters count pods, not rebuilds or relists.

    Pods are forgotten when they are deleted (``forget``) or no longer listed (``retain``).
    """

    def __init__(self) -> None:
        self._reasons: dict[str, set[Reason]] = {}

    def note(self, uid: str, reason: Reason) -> Report:
        """Record one sighting; say whether it is news."""
        seen = self._reasons.get(uid)
        if seen is None:
            self._reasons[uid] = {reason}
            return Report(count=True, tell=True)
        if reason in seen:
            return Report(count=False, tell=False)
        seen.add(reason)
        return Report(count=True, tell=False)

    def forget(self, uid: str) -> None:
        """Drop a deleted pod."""
        self._reasons.pop(uid, None)

    def retain(self, uids: Iterable[str]) -> None:
        """Keep only these pods (after a full list)."""
        keep = set(uids)
        for uid in [u for u in self._reasons if u not in keep]:
            del self._reasons[uid]


@dataclass(frozen=True)
class NodeReading:
    """One read of a node's pods, judged: what the device plugin answers and checks from."""

    pods: NodePods
    by_uid: Mapping[str, KubeObject]
    """Every pod read, by UID (their specs give cGPU weights)."""
    finished: frozenset[str]
    """UIDs of the pods read in a terminal phase."""
    reports: tuple[tuple[KubeObject, Ignored], ...] = ()
    """The ignored allocations to count and log: each pod once per reason (``IgnoredOnce``)."""


class NodeJudge:
    """One node's pods, judged read after read, as the device plugin reads them.

    Judgements are kept while their pods are read again (``Judged``), and an ignored allocation
    is reported once per pod and reason, so one read is one call here and the plugin only acts
    on the value: counts and logs the reports, answers from the pods.
    """

    def __init__(self, trust: Trust, names: ResourceNames, *, node: str) -> None:
        self.node = node
        self._judged = Judged(trust, names)
        self._reported = IgnoredOnce()

    def read(self, pods: Sequence[KubeObject]) -> NodeReading:
        """These pods of this node (listed, or the watch's), judged."""
        judged = sort_node_pods(pods, node=self.node, trust=self._judged)
        by_uid = {uid_of(p): p for p in pods}
        self._judged.retain(by_uid)
        self._reported.retain(by_uid)
        reports = tuple(
            (pod, why)
            for pod, why in judged.ignored
            if self._reported.note(uid_of(pod), why.reason).count
        )
        finished = frozenset(
            uid for uid, pod in by_uid.items() if pod_status_of(pod).get("phase") in TERMINAL_PHASES
        )
        return NodeReading(judged, by_uid, finished, reports)
