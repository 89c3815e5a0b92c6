"""The KubeAPI port over lightkube: the only module that imports the client library.

Library errors are translated into gpushare's own tree (``gpushare.kube.port``) here, so no
``httpx`` or ``lightkube`` exception leaks into the extender or the CLI.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar, cast

import httpx2
import msgspec
from lightkube import AsyncClient, KubeConfig
from lightkube.config.kubeconfig import SingleConfig
from lightkube.core import resource as lightkube_resource
from lightkube.core.exceptions import ApiError, ConfigError, NotReadyError
from lightkube.generic_resource import create_global_resource, create_namespaced_resource
from lightkube.models.authentication_v1 import TokenReviewSpec
from lightkube.models.authorization_v1 import NonResourceAttributes, SubjectAccessReviewSpec
from lightkube.models.core_v1 import ObjectReference
from lightkube.models.meta_v1 import ObjectMeta, Status
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.authentication_v1 import TokenReview
from lightkube.resources.authorization_v1 import SubjectAccessReview
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Event, Node, Pod, Secret
from lightkube.types import PatchType

from gpushare.core.admitting.metricsaccess import AccessVerdict, Identity, TokenVerdict
from gpushare.core.model.kubejson import name_problem
from gpushare.core.model.names import ALLOCATION_MODE_DRA, DRA_DRIVER, LABEL_ALLOCATION_MODE
from gpushare.core.resourcepolicies.resourcepolicy import GROUP, KIND, PLURAL, VERSION
from gpushare.kube.port import (
    Conflict,
    Forbidden,
    Gone,
    KubeDict,
    KubeError,
    NotFound,
    Unauthorized,
    Unreachable,
    WatchEvent,
)

ResourcePolicyResource: Any = create_namespaced_resource(GROUP, VERSION, KIND, PLURAL)
# DRA objects as generic resources, read and written as plain dicts: lightkube's own
# resource.k8s.io models may predate fields gpushare writes (consumable capacity, KEP-5075), and
# a model drops what it does not know.
ResourceSliceResource: Any = create_global_resource(
    "resource.k8s.io", "v1", "ResourceSlice", "resourceslices"
)
ResourceClaimResource: Any = create_namespaced_resource(
    "resource.k8s.io", "v1", "ResourceClaim", "resourceclaims"
)
ResourceClaimTemplateResource: Any = create_namespaced_resource(
    "resource.k8s.io", "v1", "ResourceClaimTemplate", "resourceclaimtemplates"
)


class _WatchLine(msgspec.Struct):
    """One line of a watch stream, its object as a plain dict."""

    type: str
    object: dict[str, Any]


_WATCH_LINE = msgspec.json.Decoder(_WatchLine)


def _body_text(response: httpx2.Response) -> str:
    """The start of an error answer's body, or its reason phrase when unread (a watch)."""
    try:
        text = response.text.strip()[:200]
    except httpx2.ResponseNotRead:
        text = ""
    return text or response.reason_phrase


def _translate(err: Exception, what: str) -> KubeError:
    if isinstance(err, ApiError):
        code = err.status.code
        message = f"{what}: {err.status.message}"
    elif isinstance(err, httpx2.HTTPStatusError):
        # Not every error answer is a Status: a path the apiserver does not serve at all (the
        # group of a CRD that is not installed) gets a plain-text 404 "page not found", which
        # lightkube raises as the HTTP library's error.
        code = err.response.status_code
        message = f"{what}: {_body_text(err.response)}"
    else:
        return Unreachable(f"{what}: {type(err).__name__}: {err}")
    if code is not None:
        if code == 404:
            return NotFound(message)
        if code == 409:
            return Conflict(message)
        if code == 410:
            return Gone(message)
        if code == 403:
            return Forbidden(f"{message} (forbidden to these credentials)")
        if code == 401:
            return Unauthorized(f"{message} (check the credentials in your kubeconfig)")
    return KubeError(f"{message} (HTTP {code})")


_LIBRARY_ERRORS = (ApiError, httpx2.HTTPError, OSError)
"""What lightkube and its HTTP library raise for a failed call: an answer that is an error
(``ApiError`` with a Status, ``HTTPStatusError`` without one) or no answer at all."""


@contextmanager
def _mapped(what: str) -> Iterator[None]:
    """Raise the library's errors as gpushare's tree (``_translate``), the cause kept."""
    try:
        yield
    except _LIBRARY_ERRORS as err:
        raise _translate(err, what) from err


_Review = TypeVar("_Review", TokenReview, SubjectAccessReview)
_Verdict = TypeVar("_Verdict", TokenVerdict, AccessVerdict)


def _token_verdict(answer: TokenReview) -> TokenVerdict:
    """A TokenReview's answer: who the token is, or why kube-apiserver does not say."""
    status = answer.status
    if status is None or not status.authenticated or status.user is None:
        return TokenVerdict(reason=(status.error if status else "") or "")
    user = status.user
    extra = {k: tuple(v or ()) for k, v in (user.extra or {}).items()}
    identity = Identity(
        user=user.username or "",
        uid=user.uid or "",
        groups=tuple(user.groups or ()),
        extra=extra,
    )
    return TokenVerdict(identity=identity)


def _access_verdict(answer: SubjectAccessReview) -> AccessVerdict:
    """A SubjectAccessReview's answer: allowed or not, and kube-apiserver's reason."""
    status = answer.status
    if status is None:
        return AccessVerdict(error="the SubjectAccessReview came back without a status")
    if status.evaluationError and not status.allowed:
        return AccessVerdict(reason=f"{status.reason or ''} {status.evaluationError}".strip())
    return AccessVerdict(allowed=bool(status.allowed), reason=status.reason or "")


def load_config(kubeconfig: str | None = None, context: str | None = None) -> SingleConfig:
    """The cluster config from a file, $KUBECONFIG, ~/.kube/config or in-cluster."""
    try:
        config = KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_env()
        single = config.get(context_name=context)
    except (ConfigError, OSError, KeyError) as err:
        where = kubeconfig or "$KUBECONFIG, ~/.kube/config or the in-cluster service account"
        raise Unreachable(f"cannot load a kubeconfig from {where}: {err}") from None
    if single is None:
        raise Unreachable(f"kubeconfig has no context {context!r}")
    return single


def kubeconfig_contexts(kubeconfig: str | None = None) -> dict[str, str]:
    """Each context of the kubeconfig (a file, else $KUBECONFIG or ~/.kube/config) and its
    namespace (empty when it names none), for shell completion; {} when none can be read."""
    try:
        config = KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_env()
    except (ConfigError, OSError, KeyError, ValueError):
        return {}
    return {name: context.namespace or "" for name, context in config.contexts.items()}


def _to_dict(obj: Any) -> KubeDict:
    data = obj.to_dict()
    assert isinstance(data, dict)
    return data


PAGE = 500
"""Objects per list request: a cluster's pods are listed, and taken in, a page at a time."""


def _version(listing: Any) -> str:
    """A lightkube listing's resourceVersion; empty before it answered."""
    try:
        return str(listing.resourceVersion)
    except NotReadyError:
        return ""


class _Version:
    """``metadata.resourceVersion`` of a listed object, read the way lightkube's watch does."""

    __slots__ = ("resourceVersion",)

    def __init__(self, version: object) -> None:
        self.resourceVersion = version


class _JSON(dict[str, Any]):
    """A listed or watched object as the API server's JSON, with no model in between.

    lightkube decodes a resource class that is not a model as plain JSON and hands it to the
    class; its watch reads ``metadata.resourceVersion`` to resume. A model would build every
    field of every object (``managedFields`` included) only for ``_to_dict`` to take it apart.
    """

    @property
    def metadata(self) -> _Version:
        meta = self.get("metadata")
        return _Version(meta.get("resourceVersion") if isinstance(meta, dict) else None)


class _NodeJSON(lightkube_resource.GlobalResource, _JSON):
    _api_info = Node._api_info


class _PodJSON(lightkube_resource.NamespacedResourceG, _JSON):
    _api_info = Pod._api_info


_UNREAD: dict[str, tuple[tuple[str, str], ...]] = {
    "Node": (("metadata", "managedFields"), ("status", "images"), ("status", "conditions")),
    "Pod": (("metadata", "managedFields"), ("status", "conditions")),
}
"""What the extender never reads and drops as an object comes in: the write history of every
field, a node's image list (about 50 entries on a busy node) and the condition lists."""


def _slim(obj: Any, kind: str) -> KubeDict:
    """A plain dict of ``obj`` without what ``_UNREAD`` names (top-level dicts are copied)."""
    data: KubeDict = dict(obj)
    for part, key in _UNREAD[kind]:
        inner = data.get(part)
        if isinstance(inner, dict) and key in inner:
            data[part] = {k: v for k, v in inner.items() if k != key}
    return data


def _slim_node(obj: Any) -> KubeDict:
    return _slim(obj, "Node")


def _slim_pod(obj: Any) -> KubeDict:
    return _slim(obj, "Pod")


def _names(**names: str) -> None:
    """Refuse names that no object can have before they go into a request path.

    lightkube puts names into the URL as they are; ``../nodes/x`` or ``x?dryRun=All`` would
    reach another path. kube-apiserver holds every name to ``name_problem``'s rules, so a name
    that breaks them is an object that does not exist.
    """
    for what, value in names.items():
        problem = name_problem(value, namespace=what == "namespace")
        if problem is not None:
            raise NotFound(f"{what} {problem}: no such object can exist")


class LightkubeAPI:
    """KubeAPI backed by a lightkube AsyncClient."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    @classmethod
    def connect(cls, kubeconfig: str | None = None, context: str | None = None) -> LightkubeAPI:
        """A client for the given kubeconfig and context."""
        return cls(AsyncClient(config=load_config(kubeconfig, context), field_manager="gpushare"))

    @property
    def server(self) -> str:
        """The API server's address, for messages."""
        return str(self._client.config.cluster.server)

    async def close(self) -> None:
        """Close the HTTP connections."""
        await self._client.close()

    async def _list(self, resource: Any, what: str, **options: Any) -> tuple[list[KubeDict], str]:
        """Every object of a resource (``options``: namespace, fields) and the list's version."""
        with _mapped(what):
            listing: Any = self._client.list(resource, **options)
            items = [_to_dict(item) async for item in listing]
            return items, _version(listing)

    async def _watch(
        self,
        resource: Any,
        resource_version: str,
        what: str,
        read: Callable[[Any], KubeDict] = _to_dict,
        **options: Any,
    ) -> AsyncIterator[WatchEvent]:
        with _mapped(what):
            stream: Any = self._client.watch(resource, resource_version=resource_version, **options)
            async for type_, obj in stream:
                yield WatchEvent(type=type_, object=read(obj))

    async def _slim_list(
        self, resource: Any, kind: str, what: str, **options: Any
    ) -> AsyncIterator[tuple[list[KubeDict], str]]:
        """Pages of ``PAGE`` objects as JSON without what ``_UNREAD`` names, each with the
        list's resourceVersion (one snapshot: the pages after the first continue it)."""
        with _mapped(what):
            listing: Any = self._client.list(resource, chunk_size=PAGE, **options)
            page: list[KubeDict] = []
            async for item in listing:
                page.append(_slim(item, kind))
                if len(page) == PAGE:
                    yield page, _version(listing)
                    page = []
            yield page, _version(listing)

    async def _watch_bookmarked(
        self, resource: Any, resource_version: str, what: str, **params: str | None
    ) -> AsyncIterator[WatchEvent]:
        """A watch with ``allowWatchBookmarks``, its events as plain dicts.

        lightkube 1.0's ``watch`` can neither ask for bookmarks nor read one: it decodes every
        event's object as the resource's model, and a bookmark's Pod, which carries only its
        ``metadata`` (``spec.containers`` null), fails that decoding. So the request is built
        by the client lightkube's ``watch`` uses, with the extra query parameter, and each line
        is decoded here, once, into the dict gpushare reads anyway. Like lightkube's loop, a
        stream the server ended (its ``timeoutSeconds``) is re-opened from the last
        resourceVersion seen, bookmarks included; an ``ERROR`` event ends the watch with its
        Status (410 Gone: the version is too old), and a stream that ends before any event
        (no server ends a bookmarked watch that way) with Unreachable, so the caller's backoff
        paces the retries.
        """
        generic: Any = self._client._client  # lightkube's GenericAsyncClient
        request = generic.prepare_request(
            "list",
            res=resource,
            namespace="*",
            watch=True,
            params={"allowWatchBookmarks": "true", **params},
        )
        version = resource_version
        with _mapped(what):
            while True:
                if version:
                    request.params["resourceVersion"] = version
                built = generic._client.build_request(
                    request.method,
                    request.url,
                    params=request.params,
                    timeout=generic._watch_timeout,
                )
                response = await generic.send(built, stream=True)
                lines = 0
                try:
                    if response.is_error:
                        # read the refusal's Status (a 403 names the user and the verb), which
                        # an unread stream cannot give: lightkube would raise ResponseNotRead
                        await response.aread()
                    generic.raise_for_status(response)
                    async for line in response.aiter_lines():
                        if not line.strip():
                            continue
                        lines += 1
                        event = _WATCH_LINE.decode(line)
                        if event.type == "ERROR":
                            raise ApiError(status=cast(Status, Status.from_dict(event.object)))
                        meta = event.object.get("metadata") or {}
                        version = str(meta.get("resourceVersion") or version)
                        yield WatchEvent(type=event.type, object=event.object)  # type: ignore[arg-type]
                finally:
                    await response.aclose()
                if not lines:  # not the server's timeout, which follows a bookmark: a proxy?
                    raise Unreachable(f"{what}: the stream ended before any event")

    async def list_nodes(self) -> tuple[list[KubeDict], str]:
        """All nodes (without what ``_UNREAD`` names)."""
        nodes: list[KubeDict] = []
        node_rv = ""
        async for page, version in self._slim_list(_NodeJSON, "Node", "list nodes"):
            nodes.extend(page)
            node_rv = version
        return nodes, node_rv

    def list_pod_pages(self) -> AsyncIterator[tuple[list[KubeDict], str]]:
        """All pods, ``PAGE`` at a time (without what ``_UNREAD`` names)."""
        return self._slim_list(_PodJSON, "Pod", "list pods", namespace="*")

    @property
    def namespace(self) -> str:
        """The kubeconfig context's namespace (``default`` when it names none), as kubectl's."""
        return str(self._client.namespace)

    async def list_pods(self, node: str = "", *, namespace: str = "") -> tuple[list[KubeDict], str]:
        """All pods in all namespaces (only those bound to ``node``, or of ``namespace``)."""
        fields = {"spec.nodeName": node} if node else None
        if namespace:
            _names(namespace=namespace)
            what = f"list pods in namespace {namespace}"
            return await self._list(Pod, what, namespace=namespace, fields=fields)
        return await self._list(Pod, "list pods", namespace="*", fields=fields)

    async def list_deployments(self, namespace: str) -> list[KubeDict]:
        """The Deployments of a namespace."""
        _names(namespace=namespace)
        items, _ = await self._list(
            Deployment, f"list deployments in namespace {namespace}", namespace=namespace
        )
        return items

    async def list_resource_policies(self) -> tuple[list[KubeDict], str]:
        """All ResourcePolicies (NotFound while their CRD is not installed)."""
        return await self._list(ResourcePolicyResource, "list resourcepolicies", namespace="*")

    def watch_nodes(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        """Node changes (without what ``_UNREAD`` names)."""
        return self._watch(_NodeJSON, resource_version, "watch nodes", _slim_node)

    def watch_pods(
        self, resource_version: str, *, node: str = "", bookmarks: bool = False
    ) -> AsyncIterator[WatchEvent]:
        """Pod changes (of the pods bound to ``node`` if given; with bookmarks if asked),
        without what ``_UNREAD`` names."""
        if node:
            _names(node=node)
        selector = f"spec.nodeName={node}" if node else None
        what = f"watch pods on {node}" if node else "watch pods"
        if bookmarks:
            return self._watch_bookmarked(Pod, resource_version, what, fieldSelector=selector)
        fields = {"spec.nodeName": node} if node else None
        return self._watch(
            _PodJSON, resource_version, what, _slim_pod, namespace="*", fields=fields
        )

    def watch_resource_policies(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        """ResourcePolicy changes."""
        return self._watch(
            ResourcePolicyResource, resource_version, "watch resourcepolicies", namespace="*"
        )

    async def get_pod(self, namespace: str, name: str) -> KubeDict:
        """One pod."""
        _names(namespace=namespace, name=name)
        with _mapped(f"get pod {namespace}/{name}"):
            return _to_dict(await self._client.get(Pod, name, namespace=namespace))

    async def patch_pod_annotations(
        self,
        namespace: str,
        name: str,
        annotations: Mapping[str, str | None],
        *,
        resource_version: str,
        labels: Mapping[str, str] | None = None,
    ) -> KubeDict:
        """JSON merge patch carrying metadata.resourceVersion, which the server checks."""
        metadata: dict[str, Any] = {
            "annotations": dict(annotations),
            "resourceVersion": resource_version,
        }
        if labels:
            metadata["labels"] = dict(labels)
        body = {"metadata": metadata}
        _names(namespace=namespace, name=name)
        with _mapped(f"annotate pod {namespace}/{name}"):
            patched = await self._client.patch(
                Pod, name, body, namespace=namespace, patch_type=PatchType.MERGE
            )
            return _to_dict(patched)

    async def remove_pod(self, namespace: str, name: str, *, uid: str) -> None:
        """Read the pod, then delete it if it has ``uid``.

        lightkube's delete sends no preconditions, so a pod re-created under the name between
        the read and the delete would go too; the extender deletes only Failed pods it placed,
        and a second re-creation of the same name within that moment is the window left.
        """
        _names(namespace=namespace, name=name)
        with _mapped(f"delete pod {namespace}/{name}"):
            current = _to_dict(await self._client.get(Pod, name, namespace=namespace))
            if (current.get("metadata") or {}).get("uid") != uid:
                raise NotFound(f"pod {namespace}/{name} has another UID than {uid}")
            await self._client.delete(Pod, name, namespace=namespace)

    async def add_pod(self, pod: Mapping[str, Any]) -> KubeDict:
        """Create a pod from its dictionary."""
        metadata = pod.get("metadata") or {}
        namespace, name = str(metadata.get("namespace") or ""), str(metadata.get("name") or "")
        _names(namespace=namespace, name=name)
        with _mapped(f"create pod {namespace}/{name}"):
            return _to_dict(await self._client.create(Pod.from_dict(dict(pod))))

    async def patch_pod_status(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        """Merge-patch ``pods/status``."""
        _names(namespace=namespace, name=name)
        with _mapped(f"patch pod {namespace}/{name} status"):
            await self._client.patch(
                Pod.Status, name, dict(patch), namespace=namespace, patch_type=PatchType.MERGE
            )

    async def get_lease(self, namespace: str, name: str) -> KubeDict:
        """One Lease."""
        _names(namespace=namespace, name=name)
        with _mapped(f"get lease {namespace}/{name}"):
            return _to_dict(await self._client.get(Lease, name, namespace=namespace))

    async def get_node(self, name: str) -> KubeDict:
        """One node."""
        _names(name=name)
        with _mapped(f"get node {name}"):
            return _to_dict(await self._client.get(Node, name))

    async def get_secret(self, namespace: str, name: str) -> KubeDict:
        """One Secret."""
        _names(namespace=namespace, name=name)
        with _mapped(f"get secret {namespace}/{name}"):
            return _to_dict(await self._client.get(Secret, name, namespace=namespace))

    async def create_secret(
        self, namespace: str, name: str, data: Mapping[str, bytes], labels: Mapping[str, str]
    ) -> KubeDict:
        """Create an Opaque Secret; Conflict (409) when it exists."""
        _names(namespace=namespace, name=name)
        secret = Secret(
            metadata=ObjectMeta(name=name, namespace=namespace, labels=dict(labels)),
            type="Opaque",
            data={k: base64.b64encode(v).decode() for k, v in data.items()},
        )
        with _mapped(f"create secret {namespace}/{name}"):
            return _to_dict(await self._client.create(secret))  # its namespace is in metadata

    async def create_claim_template(self, template: Mapping[str, Any]) -> KubeDict:
        """Create a ResourceClaimTemplate in its namespace; Conflict (409) when it exists."""
        metadata = template.get("metadata") or {}
        namespace, name = str(metadata.get("namespace", "")), str(metadata.get("name", ""))
        _names(namespace=namespace, name=name)
        with _mapped(f"create resourceclaimtemplate {namespace}/{name}"):
            posted = ResourceClaimTemplateResource.from_dict(dict(template))
            created = await self._client.create(posted)
            return _to_dict(created)

    async def get_claim_template(self, namespace: str, name: str) -> KubeDict:
        """One ResourceClaimTemplate."""
        _names(namespace=namespace, name=name)
        with _mapped(f"get resourceclaimtemplate {namespace}/{name}"):
            found = await self._client.get(ResourceClaimTemplateResource, name, namespace=namespace)
            return _to_dict(found)

    async def patch_node(
        self,
        name: str,
        *,
        annotations: Mapping[str, str | None] | None = None,
        capacity: Mapping[str, str] | None = None,
        labels: Mapping[str, str | None] | None = None,
    ) -> None:
        """Merge-patch labels and annotations in one write, then status capacity/allocatable
        (the status subresource)."""
        metadata: dict[str, Any] = {}
        if annotations:
            metadata["annotations"] = dict(annotations)
        if labels:
            metadata["labels"] = dict(labels)
        _names(name=name)
        with _mapped(f"patch node {name}"):
            if metadata:
                await self._client.patch(
                    Node, name, {"metadata": metadata}, patch_type=PatchType.MERGE
                )
            if capacity:
                body = {"status": {"capacity": dict(capacity), "allocatable": dict(capacity)}}
                await self._client.patch(Node.Status, name, body, patch_type=PatchType.MERGE)

    async def patch_node_json(self, name: str, operations: Sequence[Mapping[str, Any]]) -> KubeDict:
        """PATCH ``application/json-patch+json``; a failed ``test`` (422) is a Conflict.

        kube-apiserver applies the whole patch to the node as stored, or nothing: an operation
        that does not apply (a ``test`` that fails, a path that is gone) is answered 422 with
        only "the server rejected our request due to an error in our request", no kind and no
        causes (``applyJSPatch`` in k8s.io/apiserver v0.36.3 pkg/endpoints/handlers/patch.go,
        ``NewGenericServerResponse``), unlike a node the patch made invalid (``NewInvalid``:
        kind Node, a cause per field), which stays a KubeError.
        """
        _names(name=name)
        what = f"patch node {name}"
        try:
            with _mapped(what):
                patched = await self._client.patch(
                    Node, name, [dict(op) for op in operations], patch_type=PatchType.JSON
                )
        except KubeError as err:
            cause = err.__cause__
            status = cause.status if isinstance(cause, ApiError) else None
            details = status.details if status else None
            if status and status.code == 422 and not (details and (details.kind or details.causes)):
                raise Conflict(
                    f"{what}: the patch did not apply: a test failed or a path is gone (HTTP "
                    "422; the node changed since it was read)"
                ) from err
            raise
        return _to_dict(patched)

    async def list_resource_slices(self) -> tuple[list[KubeDict], str]:
        """gpushare's ResourceSlices (field selector ``spec.driver``)."""
        return await self._list(
            ResourceSliceResource, "list resourceslices", fields={"spec.driver": DRA_DRIVER}
        )

    def watch_resource_slices(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        """Changes of gpushare's ResourceSlices."""
        return self._watch(
            ResourceSliceResource,
            resource_version,
            "watch resourceslices",
            fields={"spec.driver": DRA_DRIVER},
        )

    async def list_resource_claims(self, namespace: str = "") -> tuple[list[KubeDict], str]:
        """Every ResourceClaim, or those of ``namespace``."""
        if namespace:
            _names(namespace=namespace)
            return await self._list(
                ResourceClaimResource,
                f"list resourceclaims in namespace {namespace}",
                namespace=namespace,
            )
        return await self._list(ResourceClaimResource, "list resourceclaims", namespace="*")

    def watch_resource_claims(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        """ResourceClaim changes."""
        return self._watch(
            ResourceClaimResource, resource_version, "watch resourceclaims", namespace="*"
        )

    async def list_dra_nodes(self) -> tuple[list[KubeDict], str]:
        """Nodes labelled for DRA mode, without what ``_UNREAD`` names."""
        with _mapped("list DRA nodes"):
            listing: Any = self._client.list(
                _NodeJSON, labels={LABEL_ALLOCATION_MODE: ALLOCATION_MODE_DRA}
            )
            items = [_slim_node(item) async for item in listing]
            return items, _version(listing)

    def watch_dra_nodes(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        """Changes of nodes labelled for DRA mode."""
        return self._watch(
            _NodeJSON,
            resource_version,
            "watch DRA nodes",
            _slim_node,
            labels={LABEL_ALLOCATION_MODE: ALLOCATION_MODE_DRA},
        )

    async def get_resource_claim(self, namespace: str, name: str) -> KubeDict:
        """One claim as stored now."""
        _names(namespace=namespace, name=name)
        with _mapped(f"get resourceclaim {namespace}/{name}"):
            return _to_dict(
                await self._client.get(ResourceClaimResource, name, namespace=namespace)
            )

    async def replace_resource_claim(self, claim: Mapping[str, Any]) -> KubeDict:
        """PUT the claim; the server checks ``metadata.resourceVersion`` (409: Conflict)."""
        meta = claim.get("metadata") or {}
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        _names(namespace=namespace, name=name)
        with _mapped(f"update resourceclaim {namespace}/{name}"):
            obj = ResourceClaimResource.from_dict(dict(claim))
            return _to_dict(await self._client.replace(obj, name, namespace=namespace))

    async def replace_resource_claim_status(self, claim: Mapping[str, Any]) -> KubeDict:
        """PUT the claim's status; the server checks ``metadata.resourceVersion``."""
        meta = claim.get("metadata") or {}
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        _names(namespace=namespace, name=name)
        with _mapped(f"update resourceclaim {namespace}/{name} status"):
            obj = ResourceClaimResource.Status.from_dict(dict(claim))
            return _to_dict(await self._client.replace(obj, name, namespace=namespace))

    async def patch_pod_json(
        self, namespace: str, name: str, operations: Sequence[Mapping[str, Any]]
    ) -> KubeDict:
        """PATCH a pod ``application/json-patch+json``; a failed ``test`` (422) is a Conflict
        (see ``patch_node_json``)."""
        _names(namespace=namespace, name=name)
        what = f"patch pod {namespace}/{name}"
        try:
            with _mapped(what):
                patched = await self._client.patch(
                    Pod,
                    name,
                    [dict(op) for op in operations],
                    namespace=namespace,
                    patch_type=PatchType.JSON,
                )
        except KubeError as err:
            cause = err.__cause__
            status = cause.status if isinstance(cause, ApiError) else None
            details = status.details if status else None
            if status and status.code == 422 and not (details and (details.kind or details.causes)):
                raise Conflict(f"{what}: the patch did not apply: the pod changed") from err
            raise
        return _to_dict(patched)

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
        """POST the ``pods/binding`` subresource, with annotations and preconditions.

        kube-apiserver's ``BindingREST`` takes the binding's UID and resourceVersion as
        preconditions and merges its annotations into the pod as it sets the node
        (``setPodNodeAndMetadata`` in pkg/registry/core/pod/storage/storage.go).
        """
        binding = Pod.Binding(
            metadata=ObjectMeta(
                name=name,
                namespace=namespace,
                uid=uid,
                annotations=dict(annotations) if annotations else None,
                resourceVersion=resource_version or None,
            ),
            target=ObjectReference(apiVersion="v1", kind="Node", name=node),
        )
        _names(namespace=namespace, name=name, node=node)
        with _mapped(f"bind pod {namespace}/{name} to {node}"):
            # the server answers a successful binding with a Status, not a Binding, which
            # lightkube's create cannot decode as the type it posted: the answer is not read
            await self._create_unread(binding, name=name, namespace=namespace)

    async def _create_unread(self, obj: Any, *, namespace: str, name: str | None = None) -> None:
        """POST ``obj`` as lightkube's ``create`` does, without decoding the answer.

        ``create`` decodes the server's answer into the posted type's model, field by field:
        for the binding and the Event of every pod, that was most of what each write cost the
        extender, and nothing reads it. An error still arrives as ApiError (``raise_for_status``).
        """
        generic: Any = self._client._client  # lightkube's GenericAsyncClient
        request = generic.prepare_request(
            "post",
            obj=obj,
            name=name,
            namespace=namespace,
            params={"fieldManager": None, "dryRun": None},  # as create() sends them
        )
        request.response_type = None
        response = await generic.send(generic.build_adapter_request(request))
        generic.raise_for_status(response)

    async def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        """POST a core/v1 Event in the namespace."""
        _names(namespace=namespace)
        with _mapped(f"create event in {namespace}"):
            posted = cast(Event, Event.from_dict(dict(event)))  # from_dict is typed as the mixin
            await self._create_unread(posted, namespace=namespace)

    async def patch_event(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        """Merge-patch an Event."""
        _names(namespace=namespace, name=name)
        with _mapped(f"patch event {namespace}/{name}"):
            await self._client.patch(
                Event, name, dict(patch), namespace=namespace, patch_type=PatchType.MERGE
            )

    async def review_token(self, token: str) -> TokenVerdict:
        """POST a TokenReview; its error, or a failed call, comes back as the verdict."""
        review = TokenReview(spec=TokenReviewSpec(token=token))
        return await self._review(review, _token_verdict, lambda error: TokenVerdict(error=error))

    async def review_access(self, identity: Identity, *, path: str, verb: str) -> AccessVerdict:
        """POST a SubjectAccessReview for a non-resource URL."""
        review = SubjectAccessReview(
            spec=SubjectAccessReviewSpec(
                user=identity.user,
                uid=identity.uid or None,
                groups=list(identity.groups) or None,
                extra={k: list(v) for k, v in identity.extra.items()} or None,
                nonResourceAttributes=NonResourceAttributes(path=path, verb=verb),
            )
        )
        return await self._review(review, _access_verdict, lambda error: AccessVerdict(error=error))

    async def _review(
        self,
        review: _Review,
        verdict: Callable[[_Review], _Verdict],
        failed: Callable[[str], _Verdict],
    ) -> _Verdict:
        """POST a review (TokenReview, SubjectAccessReview) and read kube-apiserver's answer
        with ``verdict``; a call that fails becomes ``failed(why)``: the caller answers the
        scrape, it does not raise."""
        try:
            with _mapped(f"create {type(review).__name__.lower()}"):
                answer = await self._client.create(review)
        except KubeError as err:
            return failed(str(err))
        return verdict(answer)

    # -- DRA driver (SliceAPI) ----------------------------------------------------------------

    async def list_node_slices(self, node: str, driver: str) -> list[KubeDict]:
        """The slices of ``driver`` on ``node``."""
        _names(node=node)
        fields = {"spec.nodeName": node, "spec.driver": driver}
        items, _ = await self._list(
            ResourceSliceResource, f"list resourceslices of {driver} on {node}", fields=fields
        )
        return items

    async def create_resource_slice(self, obj: Mapping[str, Any]) -> KubeDict:
        """Create a slice."""
        name = str((obj.get("metadata") or {}).get("name", ""))
        with _mapped(f"create resourceslice {name}"):
            created = await self._client.create(ResourceSliceResource.from_dict(dict(obj)))
            return _to_dict(created)

    async def replace_resource_slice(self, obj: Mapping[str, Any]) -> KubeDict:
        """Replace a slice (the resourceVersion in ``obj`` guards against a lost update)."""
        name = str((obj.get("metadata") or {}).get("name", ""))
        _names(name=name)
        with _mapped(f"replace resourceslice {name}"):
            replaced = await self._client.replace(ResourceSliceResource.from_dict(dict(obj)))
            return _to_dict(replaced)

    async def delete_resource_slice(self, name: str) -> None:
        """Delete a slice."""
        _names(name=name)
        with _mapped(f"delete resourceslice {name}"):
            await self._client.delete(ResourceSliceResource, name)
