"""Who may read a component's ``/metrics``: the decision, and the cache that keeps it cheap.

The device plugin's series name every GPU container of its node (namespace, pod, container,
GPU UUID, limit and use) and the extender's add up GPU memory per namespace: tenant data that a
tenant of another namespace must not read by scraping a pod IP. So ``/metrics`` asks what the
API server's own endpoints ask (kube-rbac-proxy and controller-runtime's metrics filter do the
same): a bearer token that a TokenReview authenticates, whose identity a SubjectAccessReview
allows ``get`` on the non-resource URL ``/metrics``. The monitoring stack's ServiceAccount holds
that right (kube-prometheus-stack's Prometheus ClusterRole grants it; the chart binds
``<release>-metrics-reader`` to whomever ``metrics.authorization.subjects`` names); a tenant's
does not.

This module is the pure part: reading the ``Authorization`` header, turning the two reviews'
answers into an HTTP outcome with its reason, and remembering outcomes per token for a short
time. Remembering is what keeps a scrape every 15 s from costing kube-apiserver two writes each
time: an allowed token is asked about again after ``allowed_ttl_s`` (so a revoked token or a
removed binding stops working within it), a refused one after ``denied_ttl_s`` (so a newly
granted right works soon, and a scraper with a bad token does not make a review per scrape).
The cache is bounded: past ``max_entries`` the least recently used token is forgotten, so a
stream of made-up tokens costs reviews, never memory. Tokens are kept only as SHA-256 digests.
A failed review (the API server unreachable) is never remembered.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

METRICS_PATH = "/metrics"
"""The non-resource URL a scraper must be allowed to ``get``, as for kube-apiserver's own."""

METRICS_VERB = "get"

Outcome = Literal["allowed", "unauthenticated", "forbidden", "unavailable"]
"""200, 401, 403, 503: each counted in ``gpushare_metrics_scrapes_total{outcome}``."""

STATUS: Mapping[Outcome, int] = {
    "allowed": 200,
    "unauthenticated": 401,
    "forbidden": 403,
    "unavailable": 503,
}


@dataclass(frozen=True)
class Identity:
    """Who a token is, as TokenReview tells it (what SubjectAccessReview is asked about)."""

    user: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class TokenVerdict:
    """A TokenReview's answer: the identity, or why there is none.

    ``error`` set means the review itself failed (no answer from the API server), which says
    nothing about the token.
    """

    identity: Identity | None = None
    reason: str = ""
    error: str = ""


@dataclass(frozen=True)
class AccessVerdict:
    """A SubjectAccessReview's answer (``error``: the review itself failed)."""

    allowed: bool = False
    reason: str = ""
    error: str = ""


@dataclass(frozen=True)
class ScrapeDecision:
    """What a request for ``/metrics`` gets, and why (the reason goes in the reply and the log)."""

    outcome: Outcome
    reason: str
    user: str = ""

    @property
    def allowed(self) -> bool:
        return self.outcome == "allowed"

    @property
    def status(self) -> int:
        return STATUS[self.outcome]


def bearer_token(header: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header; "" when there is none."""
    if not header:
        return ""
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return ""
    return token.strip()


def missing_token(header: str | None) -> ScrapeDecision:
    """401 for a request without a bearer token, saying what to send."""
    what = "no Authorization header" if not header else "the Authorization header is not Bearer"
    return ScrapeDecision(
        "unauthenticated",
        f"{what}: send a ServiceAccount token (Authorization: Bearer <token>) whose identity "
        f"may get {METRICS_PATH} (the chart's <release>-metrics-reader ClusterRole)",
    )


def after_token_review(verdict: TokenVerdict) -> ScrapeDecision | None:
    """The decision a TokenReview alone settles (401 or 503), or None: ask about access."""
    if verdict.error:
        return ScrapeDecision("unavailable", f"cannot review the token: {verdict.error}")
    if verdict.identity is None:
        why = verdict.reason or "the API server does not know it"
        return ScrapeDecision("unauthenticated", f"token not authenticated: {why}")
    return None


def decide(identity: Identity, access: AccessVerdict) -> ScrapeDecision:
    """200 or 403 for an authenticated identity, from the SubjectAccessReview (503 if it
    failed)."""
    if access.error:
        return ScrapeDecision(
            "unavailable", f"cannot review access: {access.error}", user=identity.user
        )
    if access.allowed:
        return ScrapeDecision("allowed", access.reason or "allowed", user=identity.user)
    why = f" ({access.reason})" if access.reason else ""
    return ScrapeDecision(
        "forbidden",
        f"{identity.user} may not {METRICS_VERB} {METRICS_PATH}{why}: bind it to the chart's "
        f"<release>-metrics-reader ClusterRole (values metrics.authorization.subjects)",
        user=identity.user,
    )


def token_key(token: str) -> str:
    """How the cache names a token: its SHA-256, so no token is kept in memory."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass
class ReviewCache:
    """Decisions per token digest for a short time; bounded, least recently used first out."""

    allowed_ttl_s: float = 60.0
    """Seconds an allowed token is served without asking again: at most this long a revoked
    token (or a removed binding) still reads ``/metrics``. At a 15 s scrape interval, one pair
    of reviews in every four scrapes."""
    denied_ttl_s: float = 10.0
    """Seconds a refused token is refused without asking again: a granted right works within
    it, and a scraper with a bad token costs a pair of reviews at most this often."""
    max_entries: int = 256
    """Tokens remembered at once: every scraper of a component, with room to spare."""
    _entries: OrderedDict[str, tuple[float, ScrapeDecision]] = field(
        default_factory=OrderedDict, repr=False
    )

    def __post_init__(self) -> None:
        if self.allowed_ttl_s < 0 or self.denied_ttl_s < 0:
            raise ValueError(
                f"review cache TTLs must be >= 0 seconds, got allowed {self.allowed_ttl_s} and "
                f"denied {self.denied_ttl_s}; 0 asks the API server on every scrape"
            )
        if self.max_entries < 1:
            raise ValueError(f"review cache max_entries must be >= 1, got {self.max_entries}")

    def get(self, key: str, now: float) -> ScrapeDecision | None:
        """The remembered decision, or None when there is none or it expired."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        expires, decision = entry
        if now >= expires:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return decision

    def put(self, key: str, decision: ScrapeDecision, now: float) -> None:
        """Remember a decision (an unavailable one is not: it says nothing about the token)."""
        if decision.outcome == "unavailable":
            return
        ttl = self.allowed_ttl_s if decision.allowed else self.denied_ttl_s
        if ttl <= 0:
            return
        self._entries[key] = (now + ttl, decision)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)
