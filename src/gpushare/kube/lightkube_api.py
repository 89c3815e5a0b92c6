"""The KubeAPI port over lightkube: the only module that imports the client library.

Library errors are translated into gpushare's own tree (``gpushare.kube.port``) here, so no
``httpx`` or ``lightkube`` exception leaks into the extender or the CLI.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, cast

import httpx2
import msgspec
from lightkube import AsyncClient, KubeConfig
from lightkube.config.kubeconfig import SingleConfig
from lightkube.core.exceptions import ApiError, ConfigError, NotReadyError
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.core_v1 import ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event, Node, Pod, Secret
from lightkube.types import PatchType

from gpushare.core.kubejson import name_problem
from gpushare.core.resourcepolicy import GROUP, KIND, PLURAL, VERSION
from gpushare.kube.port import (
    Conflict,
    Gone,
    KubeDict,
    KubeError,
    NotFound,
    Unreachable,
    WatchEvent,
)

ResourcePolicyResource: Any = create_namespaced_resource(GROUP, VERSION, KIND, PLURAL)


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
        if code in (401, 403):
            return Unreachable(f"{message} (check the credentials in your kubeconfig)")
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


def _to_dict(obj: Any) -> KubeDict:
    data = obj.to_dict()
    assert isinstance(data, dict)
    return data


def _names(**names: str) -> None:
    """Refuse names that no object can have before they go into a request path.

    lightkube puts names into the URL as they are; ``../nodes/x`` or ``x?dryRun=All`` would
    reach another path. kube-apiserver holds every name to ``name_problem``'s rules, so a name
    that breaks them is an object that does not exist.
    """
    for what, value in names.items():
        problem = name_problem(value, namespace=what == "namespace")
        if problem:
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
            try:
                version = str(listing.resourceVersion)
            except NotReadyError:
                version = ""
            return items, version

    async def _watch(
        self, resource: Any, resource_version: str, what: str, **options: Any
    ) -> AsyncIterator[WatchEvent]:
        with _mapped(what):
            stream: Any = self._client.watch(resource, resource_version=resource_version, **options)
            async for type_, obj in stream:
                yield WatchEvent(type=type_, object=_to_dict(obj))

    async def list_nodes(self) -> tuple[list[KubeDict], str]:
        """All nodes."""
        return await self._list(Node, "list nodes")

    async def list_pods(self, node: str = "") -> tuple[list[KubeDict], str]:
        """All pods in all namespaces (only those bound to ``node`` if given)."""
        fields = {"spec.nodeName": node} if node else None
        return await self._list(Pod, "list pods", namespace="*", fields=fields)

    async def list_resource_policies(self) -> tuple[list[KubeDict], str]:
        """All ResourcePolicies (NotFound while their CRD is not installed)."""
        return await self._list(ResourcePolicyResource, "list resourcepolicies", namespace="*")

    def watch_nodes(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        """Node changes."""
        return self._watch(Node, resource_version, "watch nodes")

    def watch_pods(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        """Pod changes."""
        return self._watch(Pod, resource_version, "watch pods", namespace="*")

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
            try:
                await self._client.create(binding, name=name, namespace=namespace)
            except msgspec.ValidationError:
                # The server answers a successful binding with a Status, not a Binding; lightkube
                # cannot decode it as the type it posted. Errors arrive as ApiError instead.
                return

    async def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        """POST a core/v1 Event in the namespace."""
        _names(namespace=namespace)
        with _mapped(f"create event in {namespace}"):
            posted = cast(Event, Event.from_dict(dict(event)))  # from_dict is typed as the mixin
            # lightkube 1.0.1's overloads of AsyncClient.create match no namespaced resource
            # with namespace= under mypy (a Pod fails the same way); the call is the documented one.
            await self._client.create(posted, namespace=namespace)  # type: ignore[call-overload]

    async def patch_event(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        """Merge-patch an Event."""
        _names(namespace=namespace, name=name)
        with _mapped(f"patch event {namespace}/{name}"):
            await self._client.patch(
                Event, name, dict(patch), namespace=namespace, patch_type=PatchType.MERGE
            )
