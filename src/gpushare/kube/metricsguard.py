"""The check in front of ``/metrics``: the bearer token reviewed by the API server, remembered.

``core.admitting.metricsaccess`` decides from the reviews' answers and keeps the cache; this
module asks the API server (``ReviewAPI``: a TokenReview, then a SubjectAccessReview for ``get
/metrics``) when the cache has no answer, and counts what it asked and what it answered, which
``gpushare_metrics_reviews_total`` and ``gpushare_metrics_scrapes_total`` export: the reviews a
scrape costs kube-apiserver are the first over the second.

Two scrapes with the same new token at once may both ask; both answers are the same, and the
second one written wins, so nothing is serialised on the scrape path.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from gpushare.core.admitting.metricsaccess import (
    METRICS_PATH,
    METRICS_VERB,
    ReviewCache,
    ScrapeDecision,
    after_token_review,
    bearer_token,
    decide,
    missing_token,
    token_key,
)
from gpushare.kube.port import ReviewAPI

log = logging.getLogger(__name__)


@dataclass
class MetricsGuard:
    """Decide each ``/metrics`` request from its ``Authorization`` header."""

    api: ReviewAPI
    cache: ReviewCache = field(default_factory=ReviewCache)
    clock: Callable[[], float] = time.monotonic
    reviews: Counter[str] = field(default_factory=Counter)
    """Reviews sent to the API server, by kind (``token``, ``access``)."""
    outcomes: Counter[str] = field(default_factory=Counter)
    """Requests answered, by outcome (``core.admitting.metricsaccess.Outcome``)."""

    async def check(self, authorization: str | None) -> ScrapeDecision:
        """The decision for one request, from the cache or from the API server."""
        decision = await self._decide(authorization)
        self.outcomes[decision.outcome] += 1
        if not decision.allowed:
            log.info(
                "metrics request refused status=%d user=%s reason=%s",
                decision.status,
                decision.user or "-",
                decision.reason,
            )
        return decision

    async def _decide(self, authorization: str | None) -> ScrapeDecision:
        token = bearer_token(authorization)
        if not token:
            return missing_token(authorization)
        key = token_key(token)
        remembered = self.cache.get(key, self.clock())
        if remembered is not None:
            return remembered
        self.reviews["token"] += 1
        verdict = await self.api.review_token(token)
        decision = after_token_review(verdict)
        if decision is None:
            assert verdict.identity is not None  # after_token_review returns None only then
            self.reviews["access"] += 1
            access = await self.api.review_access(
                verdict.identity, path=METRICS_PATH, verb=METRICS_VERB
            )
            decision = decide(verdict.identity, access)
        self.cache.put(key, decision, self.clock())
        return decision
