"""The chart's side of /metrics for the monitoring stack only (metrics.authorization).

The components' ServiceAccounts may create TokenReviews and SubjectAccessReviews; a ClusterRole
``<release>-metrics-reader`` grants get on /metrics and is bound to the subjects the values
name and to the PodMonitors' own scraper; the PodMonitors scrape over HTTPS with that token.
"""

from __future__ import annotations

from typing import Any

from tests.support.chart import NAMESPACE, RELEASE, find, needs_helm, render

pytestmark = needs_helm

MONITORING = {"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"}


def args_of(docs: list[dict[str, Any]], kind: str, suffix: str, name: str) -> list[str]:
    spec = find(docs, kind, suffix)["spec"]["template"]["spec"]
    [container] = [c for c in spec["containers"] if c["name"] == name]
    return list(container["args"])


def test_metrics_authorization_is_on_by_default_with_the_rbac_it_needs() -> None:
    docs = render()
    for kind, suffix, name in (
        ("Deployment", "-scheduler", "extender"),
        ("DaemonSet", "-device-plugin", "device-plugin"),
    ):
        args = args_of(docs, kind, suffix, name)
        assert "--metrics-authorization" in args and "--metrics-auth-cache-ttl=60" in args, args
    auth = find(docs, "ClusterRole", "-metrics-auth")
    assert {(r["apiGroups"][0], r["resources"][0], tuple(r["verbs"])) for r in auth["rules"]} == {
        ("authentication.k8s.io", "tokenreviews", ("create",)),
        ("authorization.k8s.io", "subjectaccessreviews", ("create",)),
    }
    bound = find(docs, "ClusterRoleBinding", "-metrics-auth")["subjects"]
    assert {s["name"] for s in bound} == {f"{RELEASE}-scheduler", f"{RELEASE}-device-plugin"}
    reader = find(docs, "ClusterRole", "-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    # nothing to bind by default: no subjects named, no PodMonitor scraping
    assert not [
        d
        for d in docs
        if d["metadata"]["name"] == f"{RELEASE}-metrics-reader"
        and d["kind"] == "ClusterRoleBinding"
    ]


def test_the_subjects_and_the_pod_monitors_scraper_are_bound_to_the_reader() -> None:
    docs = render(
        "--set",
        "podMonitor.enabled=true",
        "--set-json",
        f"metrics.authorization.subjects=[{str(MONITORING).replace(chr(39), chr(34))}]",
    )
    binding = find(docs, "ClusterRoleBinding", "-metrics-reader")
    assert binding["roleRef"]["name"] == f"{RELEASE}-metrics-reader"
    scraper = {
        "kind": "ServiceAccount",
        "name": f"{RELEASE}-metrics-scraper",
        "namespace": NAMESPACE,
    }
    assert binding["subjects"] == [scraper, MONITORING]
    secret = find(docs, "Secret", "-metrics-scraper-token")
    assert secret["type"] == "kubernetes.io/service-account-token"
    assert secret["metadata"]["annotations"] == {
        "kubernetes.io/service-account.name": f"{RELEASE}-metrics-scraper"
    }
    for component in ("scheduler", "device-plugin"):
        [endpoint] = find(docs, "PodMonitor", f"-{component}")["spec"]["podMetricsEndpoints"]
        assert endpoint["scheme"] == "https"
        assert endpoint["authorization"] == {
            "type": "Bearer",
            "credentials": {"name": f"{RELEASE}-metrics-scraper-token", "key": "token"},
        }
        assert endpoint["tlsConfig"] == {"insecureSkipVerify": True}


def test_legacy_scrapers_get_plain_http_and_no_rbac() -> None:
    docs = render(
        "--set", "podMonitor.enabled=true", "--set", "metrics.authorization.enabled=false"
    )
    for kind, suffix, name in (
        ("Deployment", "-scheduler", "extender"),
        ("DaemonSet", "-device-plugin", "device-plugin"),
    ):
        assert "--no-metrics-authorization" in args_of(docs, kind, suffix, name)
    assert not [d for d in docs if "-metrics-" in d["metadata"]["name"]]
    [endpoint] = find(docs, "PodMonitor", "-device-plugin")["spec"]["podMetricsEndpoints"]
    assert "scheme" not in endpoint and "authorization" not in endpoint
