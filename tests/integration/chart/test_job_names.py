"""The chart's Jobs are named by a hash of their own spec, so GitOps tools sync them cleanly.

Argo CD renders the chart with ``helm template`` on every sync, where ``.Release.Revision`` is
always 1, and Flux's kustomize path applies rendered objects the same way. A Job named
``<name>-<revision>`` therefore kept its name when its spec changed, and a Job's pod template
is immutable: the apply was refused. Its ``ttlSecondsAfterFinished`` deleted it an hour after it
ran, so every later sync created it again and ran it again. Now the name carries the first 10
hex digits of the SHA-256 of the Job's rendered spec (``gpushare.jobName``): the same values,
the same name (applying again changes nothing); a change to anything the Job runs with, a new
name (the new Job is created and runs; Helm deletes the old one, Argo CD prunes it). The e2e
side (apply twice, apply after a change, ``helm upgrade``) is tests/e2e/test_gitops_jobs.py.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.support.chart import HELM, find_job, render

pytestmark = pytest.mark.skipif(HELM is None, reason="helm not built: run `make controlplane`")

COMPONENTS = ("seal", "webhook-certs")
HASHED = re.compile(r"^(?P<base>.+)-(?P<hash>[0-9a-f]{10})$")


def names(docs: list[dict[str, Any]]) -> dict[str, str]:
    return {c: find_job(docs, c)["metadata"]["name"] for c in COMPONENTS}


def test_each_job_is_named_by_a_hash_and_keeps_no_ttl() -> None:
    docs = render()
    for component in COMPONENTS:
        job = find_job(docs, component)
        found = HASHED.match(job["metadata"]["name"])
        assert found, job["metadata"]["name"]
        assert found["base"].endswith(f"-{component}")
        assert "ttlSecondsAfterFinished" not in job["spec"]
        assert job["metadata"]["annotations"]["argocd.argoproj.io/sync-options"] == (
            "PruneLast=true"
        )


def test_the_same_values_give_the_same_names() -> None:
    assert names(render()) == names(render())


@pytest.mark.parametrize(
    ("values", "changed"),
    [
        (["--set", "webhook.certs.job.validityDays=365"], {"webhook-certs"}),
        (["--set", "webhook.certs.job.image.tag=1.36.4"], {"webhook-certs"}),
        (["--set", "image.tag=9.9.9"], {"seal"}),
        (["--set-json", 'scheduler.nodeSelector={"pool":"system"}'], {"seal"}),
        (["--set", "webhook.steer.enabled=false"], {"webhook-certs"}),
        # values neither Job runs with leave both alone
        (["--set", "scheduler.replicas=3"], set()),
        (["--set", "prometheusRule.enabled=true"], set()),
    ],
)
def test_a_value_a_job_runs_with_renames_that_job_alone(
    values: list[str], changed: set[str]
) -> None:
    before, after = names(render()), names(render(*values))
    assert {c for c in COMPONENTS if before[c] != after[c]} == changed


def test_a_long_release_name_still_fits_the_job_name_label() -> None:
    """The Job controller labels its pods ``job-name: <name>``: 63 characters at most."""
    docs = render("--set", f"fullnameOverride={'x' * 60}")
    for component in COMPONENTS:
        name = find_job(docs, component)["metadata"]["name"]
        assert len(name) <= 63 and HASHED.match(name), name
