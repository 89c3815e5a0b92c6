"""An in-memory Kubernetes API: resourceVersions, conflicts, bindings and watches.

It backs unit and integration tests and the demo, so the extender and the cache run unchanged
without a cluster. It keeps an event log like etcd's; ``compact`` drops it so watches from an
older resourceVersion get ``Gone``, as a real API server does after compaction.

Like a cluster the chart installed into, it holds a seal key (core.records.trust) in the Secret
``gpushare/gpushare-seal``: random, made when the in-memory cluster is, so the extender, the
device plugin and ``kubectl inspect cgpu`` running on it share it without configuration.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import secrets
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

import msgspec

from gpushare.core.admitting.metricsaccess import AccessVerdict, Identity, TokenVerdict
from gpushare.core.model.names import ALLOCATION_MODE_DRA, DRA_DRIVER, LABEL_ALLOCATION_MODE
from gpushare.kube.port import (
    Conflict,
    EventType,
    Forbidden,
    Gone,
    KubeDict,
    NotFound,
    WatchEvent,
)

_ENCODE = msgspec.json.Encoder()
_DECODE = msgspec.json.Decoder()
_J = TypeVar("_J")


def _copy(obj: _J) -> _J:
    """A deep copy of a JSON-shaped object (all the API stores): a msgspec round trip, several
    times faster than ``copy.deepcopy`` (unit and integration tests: 31 s instead of 44).
    """
    copied: _J = _DECODE.decode(_ENCODE.encode(obj))
    return copied


def _json_patch_step(doc: Any, op: Mapping[str, Any], *, what: str) -> Any:
    """``doc`` after one RFC 6902 operation (test, add, replace, remove; paths of object keys
    and list indexes), as kube-apiserver applies a ``application/json-patch+json`` body."""
    tokens = [t.replace("~1", "/").replace("~0", "~") for t in op["path"].split("/")[1:]]
    parent: Any = doc
    for token in tokens[:-1]:
        parent = parent[int(token)] if isinstance(parent, list) else parent[token]
    last = tokens[-1] if tokens else ""
    kind = op["op"]
    if kind == "test":
        at = parent[int(last)] if isinstance(parent, list) else parent.get(last)
        if at != op["value"]:
            raise Conflict(f"patch {what}: testing value {op['path']} failed")
    elif kind in ("add", "replace") and isinstance(parent, list):
        index = len(parent) if last == "-" else int(last)
        parent[index : index + (kind == "replace")] = [_copy(op["value"])]
    elif kind in ("add", "replace"):
        parent[last] = _copy(op["value"])
    elif kind == "remove":
        del parent[int(last) if isinstance(parent, list) else last]
    else:
        raise ValueError(f"patch {what}: operation {kind!r} is not one the in-memory API knows")
    return doc


Kind = Literal["nodes", "pods", "resourcepolicies", "resourceslices", "resourceclaims"]


@dataclass(frozen=True)
class _Logged:
    version: int
    kind: Kind
    type: EventType
    object: KubeDict
    binding: bool = False
    """The change that set the pod's node (a field-selected watch sees it ADDED)."""


def _selected(event: _Logged, node: str) -> WatchEvent | None:
    """A pod event as a watch with ``fieldSelector=spec.nodeName=node`` sees it, or None.

    kube-apiserver filters a watch on the object before and after each change: a pod that starts
    to match arrives as ADDED, one that never matched not at all (k8s.io/apiserver
    pkg/storage/cacher, ``cacheWatcher.convertToWatchEvent``). A pod's node never changes once
    set, so only its binding makes a pod start to match, and its deletion is seen as it was.
    """
    if event.object.get("spec", {}).get("nodeName") != node:
        return None
    type_ = "ADDED" if event.binding else event.type
    return WatchEvent(type=type_, object=_copy(event.object))


class MemoryKube:
    """A small, faithful-enough API server in a dict."""

    def __init__(self, *, seal_key: bytes | None = None) -> None:
        self._version = 0
        self._nodes: dict[str, KubeDict] = {}
        self._pods: dict[tuple[str, str], KubeDict] = {}
        self._policies: dict[tuple[str, str], KubeDict] = {}
        self._slices: dict[str, KubeDict] = {}
        self._claims: dict[tuple[str, str], KubeDict] = {}
        self._log: list[_Logged] = []
        self._compacted = 0
        self._waiters: list[asyncio.Future[None]] = []
        self._broken: list[Exception] = []
        """Errors waiting to end the watches open when ``break_watches`` was called."""
        self._uids = 0
        self._events: dict[tuple[str, str], KubeDict] = {}
        self.seal_key = seal_key if seal_key is not None else secrets.token_hex(32).encode()
        """The key gpushare's components on this in-memory cluster share (keyless mode).

        Text, as ``gpushare seal-key`` makes: every reader drops surrounding whitespace
        (``core.records.trust.read_key``), so raw random bytes would be a different key to some
        readers
        whenever they began or ended with a whitespace byte.
        """
        self._secrets: dict[tuple[str, str], KubeDict] = {
            ("gpushare", "gpushare-seal"): {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"namespace": "gpushare", "name": "gpushare-seal"},
                "data": {"key": base64.b64encode(self.seal_key).decode()},
            }
        }
        self.calls: list[str] = []
        """Names of port methods called, in order (tests assert on the protocol used)."""
        self._deployments: dict[tuple[str, str], KubeDict] = {}
        self._leases: dict[tuple[str, str], KubeDict] = {}
        self.forbidden: set[str] = set()
        """Calls answered 403, as RBAC would: ``list_nodes``, ``list_pods:*`` (all
        namespaces), ``list_pods:NAMESPACE``, ``get_secret``, ``list_deployments:NAMESPACE``,
        ``watch_nodes``, ``watch_pods`` (the watch's first read raises),
        ``list_resource_slices``, ``list_resource_claims:*``, ``list_resource_claims:NAMESPACE``."""

    # -- writes used by tests and the demo ---------------------------------------------------

    def _record(
        self, kind: Kind, type_: EventType, obj: KubeDict, *, binding: bool = False
    ) -> KubeDict:
        self._version += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self._version)
        self._log.append(_Logged(self._version, kind, type_, _copy(obj), binding))
        self._wake_watches()
        return _copy(obj)

    def _wake_watches(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def put_node(self, node: Mapping[str, Any]) -> KubeDict:
        """Create or replace a node."""
        obj = _copy(dict(node))
        name = obj["metadata"]["name"]
        type_: EventType = "MODIFIED" if name in self._nodes else "ADDED"
        self._nodes[name] = obj
        return self._record("nodes", type_, obj)

    def delete_node(self, name: str) -> None:
        """Remove a node."""
        obj = self._nodes.pop(name)
        self._record("nodes", "DELETED", obj)

    def create_pod(self, pod: Mapping[str, Any]) -> KubeDict:
        """Store a new pod, giving it a UID and the default namespace if missing."""
        obj = _copy(dict(pod))
        meta = obj.setdefault("metadata", {})
        meta.setdefault("namespace", "default")
        meta.setdefault(
            "creationTimestamp", datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        )  # as the API server stamps it
        self._uids += 1
        meta.setdefault("uid", f"00000000-0000-0000-0000-{self._uids:012d}")
        obj.setdefault("status", {}).setdefault("phase", "Pending")
        key = (meta["namespace"], meta["name"])
        if key in self._pods:
            raise Conflict(f"pod {key[0]}/{key[1]} already exists")
        self._pods[key] = obj
        return self._record("pods", "ADDED", obj)

    def update_pod(self, namespace: str, name: str, **status: Any) -> KubeDict:
        """Change a pod's status fields (for example ``phase="Succeeded"``)."""
        obj = self._pod(namespace, name)
        obj.setdefault("status", {}).update(status)
        return self._record("pods", "MODIFIED", obj)

    def delete_pod(self, namespace: str, name: str) -> None:
        """Remove a pod at once (no grace period)."""
        obj = self._pods.pop((namespace, name), None)
        if obj is None:
            raise NotFound(f"pod {namespace}/{name} not found")
        self._record("pods", "DELETED", obj)

    def delete_pod_unseen(self, namespace: str, name: str) -> None:
        """Remove a pod and compact, as if the deletion happened while no watch was open."""
        self._pods.pop((namespace, name), None)
        self._version += 1
        self.compact()

    def pods(self) -> list[KubeDict]:
        """Copies of all pods."""
        return [_copy(p) for p in self._pods.values()]

    def nodes(self) -> list[KubeDict]:
        """Copies of all nodes."""
        return [_copy(n) for n in self._nodes.values()]

    def events(self) -> list[KubeDict]:
        """Copies of all Events, in creation order."""
        return [_copy(e) for e in self._events.values()]

    def compact(self) -> None:
        """Forget the event log, so older watches get Gone."""
        self._compacted = self._version
        self._log.clear()

    def _pod(self, namespace: str, name: str) -> KubeDict:
        try:
            return self._pods[(namespace, name)]
        except KeyError:
            raise NotFound(f"pod {namespace}/{name} not found") from None

    # -- the port ------------------------------------------------------------------------------

    def _check(self, call: str) -> None:
        """Answer 403 for a call ``forbidden`` names, as RBAC would."""
        if call in self.forbidden:
            raise Forbidden(
                f'{call}: forbidden: User "system:serviceaccount:memory:test" cannot do it '
                "(in-memory RBAC)"
            )

    async def list_nodes(self) -> tuple[list[KubeDict], str]:
        """All nodes and the current resourceVersion."""
        self.calls.append("list_nodes")
        self._check("list_nodes")
        return self.nodes(), str(self._version)

    async def list_pods(self, node: str = "", *, namespace: str = "") -> tuple[list[KubeDict], str]:
        """All pods (or those bound to ``node``, or of ``namespace``) and the current
        resourceVersion."""
        self.calls.append("list_pods")
        self._check(f"list_pods:{namespace or '*'}")
        pods = [
            p
            for p in self.pods()
            if (not node or p.get("spec", {}).get("nodeName") == node)
            and (not namespace or p["metadata"].get("namespace") == namespace)
        ]
        return pods, str(self._version)

    def put_deployment(self, deployment: Mapping[str, Any]) -> None:
        """Create or replace a Deployment (only listed back: nothing runs it)."""
        obj = _copy(dict(deployment))
        meta = obj["metadata"]
        self._deployments[(meta["namespace"], meta["name"])] = obj

    async def list_deployments(self, namespace: str) -> list[KubeDict]:
        """The Deployments of a namespace."""
        self.calls.append("list_deployments")
        self._check(f"list_deployments:{namespace}")
        return [_copy(d) for (ns, _), d in sorted(self._deployments.items()) if ns == namespace]

    async def list_pod_pages(self) -> AsyncIterator[tuple[list[KubeDict], str]]:
        """All pods as one page (``list_pods``)."""
        yield await self.list_pods()

    async def _watch(
        self, kind: Kind, resource_version: str, *, node: str = "", bookmarks: bool = False
    ) -> AsyncIterator[WatchEvent]:
        self._check(f"watch_{kind}")
        position = int(resource_version or 0)
        while True:
            if self._broken:
                raise self._broken.pop()
            if position < self._compacted:
                raise Gone(f"too old resource version: {position} ({self._compacted})")
            # the log is in version order: start after ``position`` instead of scanning it all
            start = bisect.bisect_right(self._log, position, key=lambda e: e.version)
            pending = self._log[start:]
            skipped = False
            for event in pending:
                position = event.version
                if event.kind != kind:
                    continue
                if node:
                    shown_event = _selected(event, node)
                    if shown_event is None:
                        skipped = True
                        continue
                    yield shown_event
                else:
                    yield WatchEvent(type=event.type, object=_copy(event.object))
            if self._log and self._log[-1].version > position:
                continue  # written while the last event was being handled
            # versions past the log went to Events, which no watch shows: nothing is unseen
            position = max(position, self._version)
            if bookmarks and skipped:
                # what kube-apiserver's watch cache sends a selective watch now and then
                mark = {"kind": "Pod", "metadata": {"resourceVersion": str(position)}}
                yield WatchEvent(type="BOOKMARK", object=mark)
            if position >= self._version:
                waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self._waiters.append(waiter)
                await waiter

    def expire_watches(self) -> None:
        """Compact past every open watch's version: each gets Gone (410) at once, as after
        etcd's compaction or kube-apiserver's restart with an empty watch cache."""
        self._version += 1
        self.compact()
        self._wake_watches()

    def break_watches(self, error: Exception) -> None:
        """End every open watch with ``error`` (a dropped connection, a restarted server)."""
        self._broken = [error] * len(self._waiters)
        self._wake_watches()

    def watch_nodes(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        """Node events after ``resource_version``."""
        self.calls.append("watch_nodes")
        return self._watch("nodes", resource_version)

    def watch_pods(
        self, resource_version: str, *, node: str = "", bookmarks: bool = False
    ) -> AsyncIterator[WatchEvent]:
        """Pod events after ``resource_version``; only the pods bound to ``node`` if given,
        with a BOOKMARK after changes the node's selector left out when ``bookmarks``."""
        self.calls.append("watch_pods")
        return self._watch("pods", resource_version, node=node, bookmarks=bookmarks)

    def put_resource_policy(self, policy: Mapping[str, Any]) -> KubeDict:
        """Create or replace a ResourcePolicy."""
        obj = _copy(dict(policy))
        meta = obj.setdefault("metadata", {})
        meta.setdefault("namespace", "default")
        key = (meta["namespace"], meta["name"])
        type_: EventType = "MODIFIED" if key in self._policies else "ADDED"
        self._policies[key] = obj
        return self._record("resourcepolicies", type_, obj)

    async def list_resource_policies(self) -> tuple[list[KubeDict], str]:
        """All ResourcePolicies and the current resourceVersion."""
        self.calls.append("list_resource_policies")
        return [_copy(p) for p in self._policies.values()], str(self._version)

    def watch_resource_policies(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        """ResourcePolicy events after ``resource_version``."""
        self.calls.append("watch_resource_policies")
        return self._watch("resourcepolicies", resource_version)

    # -- DRA objects (DraAPI) -------------------------------------------------------------------

    def put_resource_slice(self, obj: Mapping[str, Any]) -> KubeDict:
        """Create or replace a ResourceSlice (as a driver publishes it)."""
        stored = _copy(dict(obj))
        name = stored["metadata"]["name"]
        type_: EventType = "MODIFIED" if name in self._slices else "ADDED"
        self._slices[name] = stored
        return self._record("resourceslices", type_, stored)

    def put_resource_claim(self, claim: Mapping[str, Any]) -> KubeDict:
        """Create or replace a ResourceClaim as given (status included), with a UID."""
        stored = _copy(dict(claim))
        meta = stored.setdefault("metadata", {})
        meta.setdefault("namespace", "default")
        key = (meta["namespace"], meta["name"])
        if key not in self._claims:
            self._uids += 1
            meta.setdefault("uid", f"00000000-0000-0000-c1a1-{self._uids:012d}")
        type_: EventType = "MODIFIED" if key in self._claims else "ADDED"
        self._claims[key] = stored
        return self._record("resourceclaims", type_, stored)

    def delete_resource_claim(self, namespace: str, name: str) -> None:
        """Remove a claim at once."""
        obj = self._claims.pop((namespace, name), None)
        if obj is None:
            raise NotFound(f"resourceclaim {namespace}/{name} not found")
        self._record("resourceclaims", "DELETED", obj)

    async def list_resource_slices(self) -> tuple[list[KubeDict], str]:
        """gpushare's ResourceSlices (``spec.driver``) and the current resourceVersion."""
        self.calls.append("list_resource_slices")
        self._check("list_resource_slices")
        found = [
            _copy(s)
            for s in self._slices.values()
            if (s.get("spec") or {}).get("driver") == DRA_DRIVER
        ]
        return found, str(self._version)

    def watch_resource_slices(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        """ResourceSlice events after ``resource_version``."""
        self.calls.append("watch_resource_slices")
        return self._watch("resourceslices", resource_version)

    async def list_resource_claims(self, namespace: str = "") -> tuple[list[KubeDict], str]:
        """Every claim (or those of ``namespace``) and the current resourceVersion."""
        self.calls.append("list_resource_claims")
        self._check(f"list_resource_claims:{namespace or '*'}")
        found = [
            _copy(c) for (ns, _), c in self._claims.items() if not namespace or ns == namespace
        ]
        return found, str(self._version)

    def watch_resource_claims(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        """ResourceClaim events after ``resource_version``."""
        self.calls.append("watch_resource_claims")
        return self._watch("resourceclaims", resource_version)

    async def list_dra_nodes(self) -> tuple[list[KubeDict], str]:
        """Nodes labelled for DRA mode."""
        self.calls.append("list_dra_nodes")
        found = [
            n
            for n in self.nodes()
            if ((n.get("metadata") or {}).get("labels") or {}).get(LABEL_ALLOCATION_MODE)
            == ALLOCATION_MODE_DRA
        ]
        return found, str(self._version)

    async def watch_dra_nodes(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        """Node events after ``resource_version`` (every node: the in-memory API does not
        select by label; the allocator reads only the nodes its slices name)."""
        self.calls.append("watch_dra_nodes")
        async for event in self._watch("nodes", resource_version):
            yield event

    async def get_resource_claim(self, namespace: str, name: str) -> KubeDict:
        """One claim as stored now."""
        self.calls.append("get_resource_claim")
        found = self._claims.get((namespace, name))
        if found is None:
            raise NotFound(f"resourceclaim {namespace}/{name} not found")
        return _copy(found)

    def _replace_claim(self, claim: Mapping[str, Any], *, status: bool) -> KubeDict:
        meta = claim.get("metadata") or {}
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        stored = self._claims.get(key)
        if stored is None:
            raise NotFound(f"resourceclaim {key[0]}/{key[1]} not found")
        if meta.get("resourceVersion") != stored["metadata"].get("resourceVersion"):
            raise Conflict(
                f"resourceclaim {key[0]}/{key[1]}: resourceVersion "
                f"{meta.get('resourceVersion')} is stale"
            )
        new = _copy(stored)
        if status:  # the status subresource changes only the status
            new["status"] = _copy(dict(claim.get("status") or {}))
        else:  # the main resource leaves the status as it is
            new = {**_copy(dict(claim)), "status": new.get("status") or {}}
        self._claims[key] = new
        return self._record("resourceclaims", "MODIFIED", new)

    async def replace_resource_claim(self, claim: Mapping[str, Any]) -> KubeDict:
        """PUT the claim; Conflict on a stale resourceVersion."""
        self.calls.append("replace_resource_claim")
        return self._replace_claim(claim, status=False)

    async def replace_resource_claim_status(self, claim: Mapping[str, Any]) -> KubeDict:
        """PUT the claim's status; Conflict on a stale resourceVersion."""
        self.calls.append("replace_resource_claim_status")
        return self._replace_claim(claim, status=True)

    async def patch_pod_json(
        self, namespace: str, name: str, operations: Sequence[Mapping[str, Any]]
    ) -> KubeDict:
        """Apply a JSON patch to a pod, all or none; a failed ``test`` is a Conflict."""
        self.calls.append("patch_pod_json")
        patched = _copy(self._pod(namespace, name))
        for op in operations:
            patched = _json_patch_step(patched, op, what=f"pod {namespace}/{name}")
        self._pods[(namespace, name)] = patched
        return self._record("pods", "MODIFIED", patched)

    async def remove_pod(self, namespace: str, name: str, *, uid: str) -> None:
        """Delete the pod if it has ``uid``."""
        self.calls.append("remove_pod")
        if self._pod(namespace, name).get("metadata", {}).get("uid") != uid:
            raise NotFound(f"pod {namespace}/{name} has another UID than {uid}")
        self.delete_pod(namespace, name)

    async def add_pod(self, pod: Mapping[str, Any]) -> KubeDict:
        """Create a pod."""
        self.calls.append("add_pod")
        return _copy(self.create_pod(pod))

    async def patch_pod_status(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        """Merge the patch's ``status`` fields into the pod's (lists replace, as a merge
        patch does)."""
        self.calls.append("patch_pod_status")
        self._check("patch_pod_status")
        obj = self._pod(namespace, name)
        obj.setdefault("status", {}).update(_copy(dict(patch.get("status") or {})))
        self._record("pods", "MODIFIED", obj)

    def put_lease(self, lease: Mapping[str, Any]) -> None:
        """Store a Lease (tests: who leads)."""
        meta = lease.get("metadata") or {}
        self._leases[(str(meta.get("namespace")), str(meta.get("name")))] = _copy(dict(lease))

    async def get_lease(self, namespace: str, name: str) -> KubeDict:
        """One Lease."""
        self.calls.append("get_lease")
        self._check("get_lease")
        lease = self._leases.get((namespace, name))
        if lease is None:
            raise NotFound(f"lease {namespace}/{name} not found")
        return _copy(lease)

    async def get_pod(self, namespace: str, name: str) -> KubeDict:
        """One pod."""
        self.calls.append("get_pod")
        return _copy(self._pod(namespace, name))

    async def patch_pod_annotations(
        self,
        namespace: str,
        name: str,
        annotations: Mapping[str, str | None],
        *,
        resource_version: str,
        labels: Mapping[str, str] | None = None,
    ) -> KubeDict:
        """Merge annotations (and labels) with an optimistic-concurrency check."""
        self.calls.append("patch_pod_annotations")
        obj = self._pod(namespace, name)
        current = obj["metadata"].get("resourceVersion")
        if resource_version and current != resource_version:
            raise Conflict(
                f"pod {namespace}/{name}: resourceVersion {resource_version} is stale "
                f"(now {current})"
            )
        stored = obj["metadata"].setdefault("annotations", {})
        for key, value in annotations.items():
            if value is None:
                stored.pop(key, None)
            else:
                stored[key] = value
        if labels:
            obj["metadata"].setdefault("labels", {}).update(labels)
        return self._record("pods", "MODIFIED", obj)

    async def get_node(self, name: str) -> KubeDict:
        """One node."""
        self.calls.append("get_node")
        try:
            return _copy(self._nodes[name])
        except KeyError:
            raise NotFound(f"node {name} not found") from None

    async def get_secret(self, namespace: str, name: str) -> KubeDict:
        """One Secret."""
        self.calls.append("get_secret")
        self._check("get_secret")
        try:
            return _copy(self._secrets[(namespace, name)])
        except KeyError:
            raise NotFound(f"secret {namespace}/{name} not found") from None

    async def create_secret(
        self, namespace: str, name: str, data: Mapping[str, bytes], labels: Mapping[str, str]
    ) -> KubeDict:
        """Create an Opaque Secret; Conflict when it exists, as the API server answers."""
        self.calls.append("create_secret")
        if (namespace, name) in self._secrets:
            raise Conflict(f"secrets {name!r} already exists")
        secret: KubeDict = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {"namespace": namespace, "name": name, "labels": dict(labels)},
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
        }
        self._secrets[(namespace, name)] = secret
        return _copy(secret)

    def put_secret(self, secret: Mapping[str, Any]) -> None:
        """Create or replace a Secret (``data`` base64, as the API stores it)."""
        obj = _copy(dict(secret))
        meta = obj.setdefault("metadata", {})
        self._secrets[(str(meta.get("namespace") or "default"), str(meta["name"]))] = obj

    async def patch_node(
        self,
        name: str,
        *,
        annotations: Mapping[str, str | None] | None = None,
        capacity: Mapping[str, str] | None = None,
        labels: Mapping[str, str | None] | None = None,
    ) -> None:
        """Merge labels, annotations and status capacity/allocatable."""
        self.calls.append("patch_node")
        if name not in self._nodes:
            raise NotFound(f"node {name} not found")
        obj = self._nodes[name]
        for field, changes in (("annotations", annotations), ("labels", labels)):
            stored = obj.setdefault("metadata", {}).setdefault(field, {})
            for key, value in (changes or {}).items():
                if value is None:
                    stored.pop(key, None)
                else:
                    stored[key] = value
        status = obj.setdefault("status", {})
        for field in ("capacity", "allocatable"):
            status.setdefault(field, {}).update(capacity or {})
        self._record("nodes", "MODIFIED", obj)

    async def patch_node_json(self, name: str, operations: Sequence[Mapping[str, Any]]) -> KubeDict:
        """Apply the JSON patch's test, add, replace and remove operations, all or none; a
        failed ``test`` is a Conflict (kube-apiserver's 422)."""
        self.calls.append("patch_node_json")
        if name not in self._nodes:
            raise NotFound(f"node {name} not found")
        patched = _copy(self._nodes[name])
        for op in operations:
            patched = _json_patch_step(patched, op, what=f"node {name}")
        self._nodes[name] = patched
        return self._record("nodes", "MODIFIED", patched)

    async def bind_pod(
        self,
        namespace: str,
        name: str,
        uid: str,
        node: str,
        *,
        annotations: Mapping[str, str] | None = None,
        resource_version: str = "",
    ) -> None:
        """Bind like the ``pods/binding`` subresource: once, only the same UID and version.

        As kube-apiserver v1.36 does in ``BindingREST.setPodNodeAndMetadata``
        (pkg/registry/core/pod/storage/storage.go): the binding's UID and resourceVersion,
        when given, are preconditions (a mismatch is a 409 Conflict); any second binding is
        refused, even to the same node, because ``pod.Spec.NodeName`` is already set, and
        ``assignPod`` turns that into a 409 Conflict on ``pods/binding`` with the message
        below; the binding's annotations are merged into the pod in the same update that sets
        the node (tests/e2e/test_bind_retry.py checks this on the real server).
        """
        self.calls.append("bind_pod")
        obj = self._pod(namespace, name)
        if obj["metadata"].get("uid") != uid:
            raise Conflict(f"pod {namespace}/{name}: UID {uid} does not match")
        current = obj["metadata"].get("resourceVersion")
        if resource_version and current != resource_version:
            raise Conflict(
                f"pod {namespace}/{name}: resourceVersion {resource_version} is stale "
                f"(now {current})"
            )
        assigned = obj.get("spec", {}).get("nodeName")
        if assigned:
            raise Conflict(
                f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} is already '
                f'assigned to node "{assigned}"'
            )
        if node not in self._nodes:
            raise NotFound(f"node {node} not found")
        obj.setdefault("spec", {})["nodeName"] = node
        if annotations:
            obj["metadata"].setdefault("annotations", {}).update(annotations)
        obj.setdefault("status", {})["phase"] = "Pending"
        conditions = obj["status"].setdefault("conditions", [])
        conditions.append({"type": "PodScheduled", "status": "True"})
        self._record("pods", "MODIFIED", obj, binding=True)

    async def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        """Store an Event; a name taken already is a Conflict, as on a real server."""
        self.calls.append("create_event")
        obj = _copy(dict(event))
        meta = obj.setdefault("metadata", {})
        meta["namespace"] = namespace
        key = (namespace, str(meta.get("name", "")))
        if key in self._events:
            raise Conflict(f"event {key[0]}/{key[1]} already exists")
        self._version += 1
        meta["resourceVersion"] = str(self._version)
        self._events[key] = obj

    async def patch_event(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        """Merge top-level fields into an Event."""
        self.calls.append("patch_event")
        obj = self._events.get((namespace, name))
        if obj is None:
            raise NotFound(f"event {namespace}/{name} not found")
        obj.update(_copy(dict(patch)))


@dataclass
class MemoryReviews:
    """TokenReview and SubjectAccessReview over a table of tokens and allowed users.

    ``tokens`` maps a token to its identity; ``allowed`` holds the users who may ``get``
    ``/metrics``; ``down`` makes every review fail as an unreachable API server does. ``calls``
    counts the reviews asked, by kind, as the API server would see them.
    """

    tokens: dict[str, Identity]
    allowed: set[str]
    down: bool = False
    calls: dict[str, int] | None = None

    async def review_token(self, token: str) -> TokenVerdict:
        self._count("token")
        if self.down:
            return TokenVerdict(error="connection refused")
        identity = self.tokens.get(token)
        if identity is None:
            return TokenVerdict(reason="invalid bearer token")
        return TokenVerdict(identity=identity)

    async def review_access(self, identity: Identity, *, path: str, verb: str) -> AccessVerdict:
        self._count("access")
        if self.down:
            return AccessVerdict(error="connection refused")
        if identity.user in self.allowed and (path, verb) == ("/metrics", "get"):
            return AccessVerdict(allowed=True, reason="bound to the metrics reader")
        return AccessVerdict(reason="no RBAC policy matched")

    def _count(self, kind: str) -> None:
        if self.calls is None:
            self.calls = {}
        self.calls[kind] = self.calls.get(kind, 0) + 1
