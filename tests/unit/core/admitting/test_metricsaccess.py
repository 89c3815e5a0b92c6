"""Who may read /metrics: the decision from the reviews' answers, the header, the cache."""

from __future__ import annotations

import asyncio

import pytest

from gpushare.core.admitting.metricsaccess import (
    AccessVerdict,
    Identity,
    ReviewCache,
    ScrapeDecision,
    TokenVerdict,
    after_token_review,
    bearer_token,
    decide,
    missing_token,
    token_key,
)
from gpushare.kube.memory import MemoryReviews
from gpushare.kube.metricsguard import MetricsGuard

PROMETHEUS = Identity(
    "system:serviceaccount:monitoring:prometheus", groups=("system:authenticated",)
)
TENANT = Identity("system:serviceaccount:team-a:default", groups=("system:authenticated",))


def test_bearer_token_is_read_from_the_authorization_header() -> None:
    assert bearer_token("Bearer abc.def") == "abc.def"
    assert bearer_token("bearer  abc ") == "abc"
    assert bearer_token(None) == ""
    assert bearer_token("Basic dXNlcjpwYXNz") == ""
    assert bearer_token("Bearer") == ""


def test_no_token_is_401_saying_what_to_send() -> None:
    decision = missing_token(None)
    assert decision.status == 401
    assert "Authorization: Bearer" in decision.reason and "metrics-reader" in decision.reason
    assert "not Bearer" in missing_token("Basic x").reason


def test_a_token_the_api_server_does_not_know_is_401_and_a_failed_review_503() -> None:
    unknown = after_token_review(TokenVerdict(reason="invalid bearer token"))
    assert unknown is not None and unknown.status == 401
    assert "invalid bearer token" in unknown.reason
    failed = after_token_review(TokenVerdict(error="connection refused"))
    assert failed is not None and failed.status == 503
    assert after_token_review(TokenVerdict(identity=PROMETHEUS)) is None


def test_an_identity_without_the_right_is_403_naming_it_and_the_role() -> None:
    decision = decide(TENANT, AccessVerdict(reason="no RBAC policy matched"))
    assert decision.status == 403 and not decision.allowed
    assert TENANT.user in decision.reason and "metrics-reader" in decision.reason
    assert "no RBAC policy matched" in decision.reason
    allowed = decide(PROMETHEUS, AccessVerdict(allowed=True, reason="RBAC: allowed"))
    assert allowed.status == 200 and allowed.allowed and allowed.user == PROMETHEUS.user
    assert decide(PROMETHEUS, AccessVerdict(error="timeout")).status == 503


def test_the_cache_keeps_allowed_and_denied_for_their_ttls_and_never_an_outage() -> None:
    cache = ReviewCache(allowed_ttl_s=60, denied_ttl_s=10)
    ok = ScrapeDecision("allowed", "ok")
    no = ScrapeDecision("forbidden", "no")
    cache.put("a", ok, now=0)
    cache.put("d", no, now=0)
    cache.put("u", ScrapeDecision("unavailable", "down"), now=0)
    assert cache.get("a", 59.9) is ok and cache.get("d", 9.9) is no
    assert cache.get("u", 0) is None
    assert cache.get("d", 10) is None  # a granted right works within the denied TTL
    assert cache.get("a", 60) is None  # a revoked token stops within the allowed TTL
    assert len(cache) == 0


def test_the_cache_is_bounded_least_recently_used_out() -> None:
    cache = ReviewCache(max_entries=3)
    for key in "abc":
        cache.put(key, ScrapeDecision("allowed", key), now=0)
    assert cache.get("a", 1) is not None  # a is used: b is now the oldest
    cache.put("d", ScrapeDecision("allowed", "d"), now=1)
    assert len(cache) == 3
    assert cache.get("b", 1) is None and cache.get("a", 1) is not None


def test_the_cache_refuses_settings_that_make_no_sense() -> None:
    with pytest.raises(ValueError, match="allowed -1"):
        ReviewCache(allowed_ttl_s=-1)
    with pytest.raises(ValueError, match="max_entries must be >= 1, got 0"):
        ReviewCache(max_entries=0)


def test_tokens_are_kept_as_digests() -> None:
    assert token_key("secret") != "secret" and len(token_key("secret")) == 64


def test_the_guard_asks_the_api_server_once_per_ttl_per_token() -> None:
    clock = [0.0]
    api = MemoryReviews(tokens={"p": PROMETHEUS, "t": TENANT}, allowed={PROMETHEUS.user})
    guard = MetricsGuard(api, ReviewCache(allowed_ttl_s=60, denied_ttl_s=10), lambda: clock[0])

    async def scrapes() -> list[int]:
        statuses = []
        for step in range(8):  # two minutes of scrapes every 15 s
            clock[0] = step * 15.0
            statuses.append((await guard.check("Bearer p")).status)
        return statuses

    assert asyncio.run(scrapes()) == [200] * 8
    # a TokenReview and a SubjectAccessReview at 0 s and at 60 s: 4 calls for 8 scrapes
    assert api.calls == {"token": 2, "access": 2}
    assert guard.reviews == {"token": 2, "access": 2} and guard.outcomes["allowed"] == 8

    assert asyncio.run(guard.check("Bearer t")).status == 403
    assert asyncio.run(guard.check("Bearer nope")).status == 401
    assert asyncio.run(guard.check(None)).status == 401
    assert api.calls == {"token": 4, "access": 3}  # no token: no review at all


def test_the_guard_answers_503_while_the_api_server_is_down_and_asks_again_after() -> None:
    api = MemoryReviews(tokens={"p": PROMETHEUS}, allowed={PROMETHEUS.user}, down=True)
    guard = MetricsGuard(api, ReviewCache(), lambda: 0.0)
    assert asyncio.run(guard.check("Bearer p")).status == 503
    api.down = False
    assert asyncio.run(guard.check("Bearer p")).status == 200
