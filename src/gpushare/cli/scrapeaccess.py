"""Who may scrape ``/metrics``: the flags the extender and the device plugin share.

Both serve series that name tenants' pods and namespaces on a port the cluster's network
reaches, so by default both serve it over HTTPS to identities allowed ``get /metrics`` only
(``scraping``); ``--no-metrics-authorization`` serves plain HTTP to anyone, for scrapers that
cannot send a token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from gpushare.cli.errors import CommandError
from gpushare.cli.options import option_group

if TYPE_CHECKING:
    from gpushare.kube.metricsguard import MetricsGuard
    from gpushare.kube.port import ReviewAPI
    from gpushare.servingcert import ServingCert


metrics_access_options = option_group(
    click.option(
        "--metrics-authorization/--no-metrics-authorization",
        default=True,
        show_default=True,
        help="Serve the metrics port over HTTPS, /metrics only to a bearer token whose identity "
        "may get the non-resource URL /metrics (TokenReview, SubjectAccessReview); "
        "/healthz stays open. --no-metrics-authorization: plain HTTP to anyone.",
    ),
    click.option(
        "--metrics-tls-cert-file",
        default=None,
        help="PEM serving certificate of the metrics port; none: a self-signed one is made at "
        "start (scrapers then skip verification).",
    ),
    click.option(
        "--metrics-tls-private-key-file",
        default=None,
        help="PEM key of --metrics-tls-cert-file.",
    ),
    click.option(
        "--metrics-auth-cache-ttl",
        type=click.FloatRange(min=0),
        default=60.0,
        show_default=True,
        help="Seconds a token allowed to read /metrics is served without asking the API server "
        "again (a revoked token works at most this long); refusals are remembered 10 s at "
        "most. 0 reviews every request.",
    ),
)
"""Add ``--metrics-authorization``, the serving certificate and the review cache's TTL."""


def metrics_access(
    api: ReviewAPI,
    *,
    enabled: bool,
    cert_file: str | None,
    key_file: str | None,
    ttl_s: float,
    name: str,
) -> tuple[MetricsGuard | None, ServingCert | None]:
    """The guard and certificate the flags ask for; (None, None) when authorization is off."""
    if not enabled:
        if cert_file or key_file:
            raise CommandError(
                "--metrics-tls-cert-file and --metrics-tls-private-key-file serve HTTPS for "
                "--metrics-authorization; drop them with --no-metrics-authorization"
            )
        return None, None
    from gpushare.core.admitting.metricsaccess import ReviewCache
    from gpushare.kube.metricsguard import MetricsGuard
    from gpushare.servingcert import ServingCertError, serving_cert

    try:
        cert = serving_cert(cert_file, key_file, name=name)
    except ServingCertError as err:
        raise CommandError(str(err)) from None
    cache = ReviewCache(allowed_ttl_s=ttl_s, denied_ttl_s=min(ttl_s, 10.0))
    return MetricsGuard(api, cache), cert
