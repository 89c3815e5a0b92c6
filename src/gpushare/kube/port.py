"""The Kubernetes API as gpushare needs it, as a port with its own error tree.

Errors (raised by every implementation, never the client library's own)::

    KubeError                 any failure talking to the API
    ├── Unreachable           no connection, TLS or auth failure
    │   ├── Unauthorized      401: the server does not accept these credentials
    │   └── Forbidden         403: these credentials may not do that (RBAC)
    ├── NotFound              404: the object is gone
    ├── Conflict              409: resourceVersion changed, or the pod is already bound
    └── Gone                  410: the watch's resourceVersion is too old; relist
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from gpushare.core.admitting.metricsaccess import AccessVerdict, Identity, TokenVerdict

KubeDict = dict[str, Any]


class KubeError(Exception):
    """A failure talking to the Kubernetes API."""


class Unreachable(KubeError):
    """The API server could not be reached or refused our credentials."""


class Unauthorized(Unreachable):
    """The server does not accept the credentials (HTTP 401: an expired or unknown token)."""


class Forbidden(Unreachable):
    """The credentials were accepted but may not do this (HTTP 403, RBAC).

    A kind of Unreachable, so a caller that only knows "the API did not answer" stays right; a
    caller that can do with less (``kubectl inspect cgpu`` for a tenant) catches it apart.
    """


class NotFound(KubeError):
    """The object does not exist (any more)."""


class Conflict(KubeError):
    """An optimistic-concurrency or binding conflict: re-read and try again."""


class Gone(KubeError):
    """A watch started from a resourceVersion the server no longer has."""


EventType = Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]


@dataclass(frozen=True)
class WatchEvent:
    """One change from a watch stream."""

    type: EventType
    object: KubeDict


class KubeAPI(Protocol):
    """What the extender, the cache and ``kubectl inspect cgpu`` need from the API server."""

    async def list_nodes(self) -> tuple[list[KubeDict], str]:
        """All nodes and the list's resourceVersion."""
        ...

    async def list_pods(self, node: str = "", *, namespace: str = "") -> tuple[list[KubeDict], str]:
        """All pods in all namespaces (only those bound to ``node`` if given; only those of
        ``namespace`` if given, which needs no cluster-wide right)."""
        ...

    def list_pod_pages(self) -> AsyncIterator[tuple[list[KubeDict], str]]:
        """All pods in all namespaces, a page at a time, each with the list's resourceVersion.

        The extender's cache takes a page in before the next is read, so a cluster's pods are
        never all decoded at once (the pages of one list are one snapshot).
        """
        ...

    def watch_nodes(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        """Node changes after ``resource_version``; raises Gone when it is too old."""
        ...

    def watch_pods(
        self, resource_version: str, *, node: str = "", bookmarks: bool = False
    ) -> AsyncIterator[WatchEvent]:
        """Pod changes after ``resource_version``; raises Gone when it is too old.

        ``node``: only pods bound to it (a field selector on ``spec.nodeName``; a pod bound there
        later arrives as ADDED). ``bookmarks``: also BOOKMARK events, whose object carries only
        a newer resourceVersion to resume from, so a quiet watch does not fall out of the
        server's window and need a list.
        """
        ...

    async def get_pod(self, namespace: str, name: str) -> KubeDict:
        """One pod as stored now."""
        ...

    async def patch_pod_annotations(
        self,
        namespace: str,
        name: str,
        annotations: Mapping[str, str | None],
        *,
        resource_version: str,
        labels: Mapping[str, str] | None = None,
    ) -> KubeDict:
        """Merge annotations (None deletes), and ``labels``, if the pod is still at
        ``resource_version``."""
        ...

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
        """Create the pod's ``pods/binding`` to the node.

        The API server writes the binding's annotations onto the pod in the same update that
        sets ``spec.nodeName``, checking the binding's UID and resourceVersion against the pod
        first (a mismatch is a Conflict), so a pod is never seen bound without them.
        """
        ...

    async def remove_pod(self, namespace: str, name: str, *, uid: str) -> None:
        """Delete the pod if it still has ``uid``; NotFound when it is gone or has another."""
        ...

    async def add_pod(self, pod: Mapping[str, Any]) -> KubeDict:
        """Create a pod (namespace and name in its metadata); Conflict while the name is taken."""
        ...

    async def patch_pod_status(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        """Merge-patch the pod's status subresource (gpushare marks its placeholder pods
        ``PodScheduled=False/Unschedulable``, as a scheduler would)."""
        ...

    async def get_lease(self, namespace: str, name: str) -> KubeDict:
        """One coordination.k8s.io/v1 Lease (who leads the scheduler replicas)."""
        ...

    async def get_node(self, name: str) -> KubeDict:
        """One node."""
        ...

    async def get_secret(self, namespace: str, name: str) -> KubeDict:
        """One Secret (``kubectl inspect cgpu`` reads the seal key from it)."""
        ...

    async def list_deployments(self, namespace: str) -> list[KubeDict]:
        """The Deployments of a namespace (``kubectl inspect cgpu --explain`` reads the
        installed extender's flags from its own)."""
        ...

    async def create_secret(
        self, namespace: str, name: str, data: Mapping[str, bytes], labels: Mapping[str, str]
    ) -> KubeDict:
        """Create an Opaque Secret; Conflict when it exists (``gpushare seal-key --secret``)."""
        ...

    async def patch_node(
        self,
        name: str,
        *,
        annotations: Mapping[str, str | None] | None = None,
        capacity: Mapping[str, str] | None = None,
        labels: Mapping[str, str | None] | None = None,
    ) -> None:
        """Merge labels and annotations (None deletes), and extended resources into status
        capacity and allocatable."""
        ...

    async def patch_node_json(self, name: str, operations: Sequence[Mapping[str, Any]]) -> KubeDict:
        """Apply a JSON patch (RFC 6902) to the node, as one write, and return the node.

        Conflict when one of its ``test`` operations fails (the node changed since it was read:
        kube-apiserver answers 422 and applies nothing).
        """
        ...

    async def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        """Create a core/v1 Event (its ``metadata.name`` is chosen by the caller)."""
        ...

    async def patch_event(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        """Merge-patch an Event (its count and lastTimestamp, for a repeat)."""
        ...


class PolicyAPI(Protocol):
    """ResourcePolicies (``scheduling.alibabacloud.com/v1alpha1``) in all namespaces.

    Both raise NotFound while the CustomResourceDefinition is not installed.
    """

    async def list_resource_policies(self) -> tuple[list[KubeDict], str]:
        """All policies and the list's resourceVersion."""
        ...

    def watch_resource_policies(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        """Policy changes after ``resource_version``."""
        ...


class DraAPI(Protocol):
    """DRA objects (``resource.k8s.io/v1``) for gpushare's DRA allocator and for what
    ``kubectl inspect cgpu`` and the extender's metrics read in DRA mode (docs/dra.md).

    Writes of a claim carry its ``metadata.resourceVersion``: the API server refuses a stale
    one with Conflict, and the caller reads the claim again.
    """

    async def list_resource_slices(self) -> tuple[list[KubeDict], str]:
        """gpushare's ResourceSlices (``spec.driver`` gpushare.io) and the list's version."""
        ...

    def watch_resource_slices(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        """Changes of gpushare's ResourceSlices."""
        ...

    async def list_resource_claims(self, namespace: str = "") -> tuple[list[KubeDict], str]:
        """Every ResourceClaim, in all namespaces (or in ``namespace``: what a tenant's Role
        may list, for ``kubectl inspect cgpu``), and the list's version."""
        ...

    def watch_resource_claims(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        """ResourceClaim changes in all namespaces."""
        ...

    async def list_dra_nodes(self) -> tuple[list[KubeDict], str]:
        """Nodes labelled for DRA mode (``gpushare.io/allocation-mode=dra``)."""
        ...

    def watch_dra_nodes(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        """Changes of nodes labelled for DRA mode."""
        ...

    async def get_resource_claim(self, namespace: str, name: str) -> KubeDict:
        """One claim as stored now."""
        ...

    async def replace_resource_claim(self, claim: Mapping[str, Any]) -> KubeDict:
        """PUT the claim (its metadata: the finalizer); Conflict when its version is stale."""
        ...

    async def replace_resource_claim_status(self, claim: Mapping[str, Any]) -> KubeDict:
        """PUT the claim's status subresource; Conflict when its version is stale."""
        ...

    async def patch_pod_json(
        self, namespace: str, name: str, operations: Sequence[Mapping[str, Any]]
    ) -> KubeDict:
        """PATCH a pod ``application/json-patch+json``; a failed ``test`` is a Conflict."""
        ...


class DraAllocatorAPI(KubeAPI, DraAPI, Protocol):
    """What DRA mode's allocator (``extender.draallocator``) writes: claims, and the pods'
    gates and ResourcePolicy marks."""


class ReviewAPI(Protocol):
    """TokenReview and SubjectAccessReview, to check who scrapes ``/metrics``
    (``core.admitting.metricsaccess``). Neither raises: a failed review is a verdict with
    ``error``."""

    async def review_token(self, token: str) -> TokenVerdict:
        """Who the API server says the bearer token is (TokenReview, the default audiences)."""
        ...

    async def review_access(self, identity: Identity, *, path: str, verb: str) -> AccessVerdict:
        """Whether ``identity`` may ``verb`` the non-resource URL ``path``
        (SubjectAccessReview)."""
        ...


class SliceAPI(Protocol):
    """What the DRA driver reads and writes (``resource.k8s.io/v1``): its node's
    ResourceSlices and the claims kubelet asks it to prepare."""

    async def list_node_slices(self, node: str, driver: str) -> list[KubeDict]:
        """The slices of ``driver`` on ``node`` (field selectors ``spec.nodeName``,
        ``spec.driver``)."""
        ...

    async def create_resource_slice(self, obj: Mapping[str, Any]) -> KubeDict:
        """Create a slice."""
        ...

    async def replace_resource_slice(self, obj: Mapping[str, Any]) -> KubeDict:
        """Replace a slice (its ``metadata.resourceVersion`` guards against a lost update)."""
        ...

    async def delete_resource_slice(self, name: str) -> None:
        """Delete a slice (NotFound when it is gone)."""
        ...

    async def get_resource_claim(self, namespace: str, name: str) -> KubeDict:
        """One claim."""
        ...


class ClaimTemplateAPI(Protocol):
    """ResourceClaimTemplates (``resource.k8s.io/v1``), which the webhook makes in DRA mode."""

    async def create_claim_template(self, template: Mapping[str, Any]) -> KubeDict:
        """Create the template in its ``metadata.namespace``; Conflict (409) when it exists."""
        ...

    async def get_claim_template(self, namespace: str, name: str) -> KubeDict:
        """One template; NotFound when there is none."""
        ...
