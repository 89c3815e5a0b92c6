"""The chart applied as GitOps tools apply it, and upgraded by Helm, on the real control plane.

Argo CD renders with ``helm template`` (``.Release.Revision`` is always 1) and applies the
objects; Flux's kustomize path does the same with rendered manifests. Before, the seal and
webhook-certs Jobs were named ``<name>-<revision>``: after a values change the apply was refused
(a Job's pod template is immutable; the message is kept in the CHANGELOG) and, with their
one-hour TTL, the next sync after that hour created and ran them again. Here the chart is
rendered twice and applied twice with ``kubectl apply`` (nothing changes the second time), then
rendered with changed values and applied (no error; the changed Job is a new one and its
controller starts its pod), and installed with Helm and upgraded: same values, the Jobs stay
the same objects; changed values, Helm replaces the changed Job.

The nodes are kwok's: a Job's pod is created but never runs its container, so "runs" here means
the Job controller took the new Job and made its pod (tests/e2e/test_helm.py's real-node test
runs both Jobs to completion).
"""

from __future__ import annotations

import json
import uuid

import pytest
import yaml

from harness.cluster import Cluster
from tests.support.e2e import CHART, eventually, helm

COMPONENTS = ("seal", "webhook-certs")


def _values(namespace: str) -> list[str]:
    """The webhooks scoped to a label nobody has and failing open, as test_helm.py installs."""
    return [
        "--set", "webhook.failurePolicy=Ignore",
        "--set", "webhook.steer.failurePolicy=Ignore",
        "--set", f"webhook.namespaceLabels.gpushare\\.io/e2e-webhook={namespace}",
    ]  # fmt: skip


def _jobs(cluster: Cluster, namespace: str) -> dict[str, dict[str, str]]:
    """Each component's Jobs in the namespace: name -> uid."""
    items = cluster.kubectl_json("get", "jobs", "-n", namespace)["items"]
    out: dict[str, dict[str, str]] = {c: {} for c in COMPONENTS}
    for job in items:
        component = job["metadata"]["labels"].get("app.kubernetes.io/component", "")
        out.setdefault(component, {})[job["metadata"]["name"]] = job["metadata"]["uid"]
    return out


def _job_names(rendered: str) -> dict[str, str]:
    docs = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Job"]
    return {
        d["metadata"]["labels"]["app.kubernetes.io/component"]: d["metadata"]["name"] for d in docs
    }


def _generations(cluster: Cluster, rendered: str) -> dict[str, str]:
    """Each rendered object's spec generation, or its resourceVersion where it has none."""
    got = json.loads(cluster.kubectl("get", "-f", "-", "-o", "json", input=rendered).stdout)
    return {
        f"{i['kind']}/{i['metadata']['name']}": str(
            i["metadata"].get("generation") or i["metadata"]["resourceVersion"]
        )
        for i in got["items"]
    }


def _has_pod(cluster: Cluster, namespace: str, job: str) -> bool:
    pods = cluster.kubectl_json("get", "pods", "-n", namespace, "-l", f"job-name={job}")
    return bool(pods["items"])


@pytest.mark.e2e
def test_rendered_chart_applied_twice_then_after_a_change(cluster: Cluster) -> None:
    suffix = uuid.uuid4().hex[:6]
    namespace, release = f"gitops-{suffix}", f"gitops-{suffix}"
    cluster.create_namespace(namespace)
    version = cluster.kubectl_json("version")["serverVersion"]["gitVersion"]

    def render(*more: str) -> str:
        out: str = helm(
            cluster, "template", release, str(CHART), "-n", namespace, "--kube-version", version,
            "--skip-tests", *_values(namespace), *more,
        ).stdout  # fmt: skip
        return out

    first, second = render(), render()
    changed = render("--set", "webhook.certs.job.validityDays=365")
    try:
        assert first == second
        applied = cluster.kubectl("apply", "-f", "-", input=first)
        assert " created" in applied.stdout
        jobs = _jobs(cluster, namespace)
        before = _generations(cluster, first)
        again = cluster.kubectl("apply", "-f", "-", input=second)
        for component in COMPONENTS:
            assert f"job.batch/{_job_names(first)[component]} unchanged" in again.stdout
        assert _generations(cluster, first) == before  # no object's spec moved
        assert _jobs(cluster, namespace) == jobs  # the same Job objects, not made anew

        after = cluster.kubectl("apply", "-f", "-", input=changed, check=False)
        assert after.returncode == 0, after.stderr  # before: spec.template: field is immutable
        old, new = _job_names(first), _job_names(changed)
        assert old["seal"] == new["seal"] and old["webhook-certs"] != new["webhook-certs"]
        assert f"job.batch/{new['webhook-certs']} created" in after.stdout
        assert f"job.batch/{old['seal']} unchanged" in after.stdout
        eventually(
            lambda: _has_pod(cluster, namespace, new["webhook-certs"]), 60, "the new Job's pod"
        )
    finally:
        cluster.kubectl("delete", "-f", "-", "--ignore-not-found", "--wait=false",
                        input=first, check=False, timeout=120)  # fmt: skip
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


@pytest.mark.e2e
def test_helm_upgrade_replaces_a_job_only_when_its_spec_changes(cluster: Cluster) -> None:
    suffix = uuid.uuid4().hex[:6]
    namespace, release = f"gitops-helm-{suffix}", f"gitops-helm-{suffix}"
    cluster.create_namespace(namespace)
    chart = [release, str(CHART), "-n", namespace, "--wait=false", *_values(namespace)]
    try:
        helm(cluster, "install", *chart)
        installed = _jobs(cluster, namespace)
        assert all(len(installed[c]) == 1 for c in COMPONENTS), installed
        helm(cluster, "upgrade", *chart)  # the same values: revision 2, the same Jobs
        assert _jobs(cluster, namespace) == installed
        helm(cluster, "upgrade", *chart, "--set", "webhook.certs.job.validityDays=365")

        def replaced() -> dict[str, dict[str, str]] | None:
            now = _jobs(cluster, namespace)
            return now if now["webhook-certs"] != installed["webhook-certs"] else None

        now = eventually(replaced, 60, "the certs Job replaced")
        assert now["seal"] == installed["seal"]
        (new,) = now["webhook-certs"]  # Helm deleted the old one
        eventually(lambda: _has_pod(cluster, namespace, new), 60, "the new Job's pod")
        manifest = helm(cluster, "get", "manifest", release, "-n", namespace).stdout
        assert json.dumps(new) in json.dumps(_job_names(manifest))
    finally:
        helm(cluster, "uninstall", release, "-n", namespace, "--wait", check=False)
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
