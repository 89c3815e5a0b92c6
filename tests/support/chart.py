"""The chart rendered by the pinned helm (``helm template``), and finding objects in it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.image_archive import recipe_repository

REPO = Path(__file__).resolve().parents[2]


CHART = REPO / "charts" / "gpushare"


CI_VALUES = CHART / "ci" / "fgd-128mib-certmanager-values.yaml"


BUILD_SH = REPO / "harness" / "controlplane" / "build.sh"


def pinned(name: str) -> str:
    """A version build.sh pins (``HELM_VERSION=v3.22.0``, or the default of one the caller may
    choose, ``K8S_VERSION="${K8S_VERSION:-v1.36.3}"``): one place says which."""
    found = re.search(
        rf'^{name}=(?:"\$\{{{name}:-([^}}"]+)\}}"|(\S+))$', BUILD_SH.read_text(), re.MULTILINE
    )
    assert found, f"{name} not in {BUILD_SH}"
    return found.group(1) or found.group(2)


HELM_VERSION = pinned("HELM_VERSION")


# helm built by `go install` (no release ldflags) assumes Kubernetes v1.20.0 when it has no
# cluster to ask, which the chart's kubeVersion refuses; render for the pinned control plane.
KUBE_VERSION = pinned("K8S_VERSION")


NAMESPACE = "gpushare-system"


GPUSHARE_IMAGE = f"{recipe_repository()}:"
"""The release's image (packaging/image.py names it); the chart's default."""


RELEASE = "gpushare"


def cached(directory: str, name: str) -> Path | None:
    """A binary build.sh caches, else none (no other one: versions must agree)."""
    cache = Path(os.environ.get("GPUSHARE_CACHE", Path.home() / ".cache" / "gpushare"))
    binary = cache / "bin" / directory / name
    return binary if binary.is_file() and os.access(binary, os.X_OK) else None


def find_helm() -> Path | None:
    """The helm that build.sh caches, else none."""
    return cached(f"helm-{HELM_VERSION}", "helm")


HELM = find_helm()


needs_helm = pytest.mark.skipif(
    HELM is None,
    reason=f"helm {HELM_VERSION} not built: run `make controlplane` (controlplane/build.sh)",
)


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    assert HELM is not None
    env = {**os.environ, "HELM_CACHE_HOME": "/tmp/gpushare-helm/cache"}
    env["HELM_CONFIG_HOME"] = "/tmp/gpushare-helm/config"
    env["HELM_DATA_HOME"] = "/tmp/gpushare-helm/data"
    env.pop("KUBECONFIG", None)
    result = subprocess.run(
        [str(HELM), *args], capture_output=True, text=True, timeout=120, env=env
    )
    if check:
        assert result.returncode == 0, f"helm {' '.join(args)}:\n{result.stdout}{result.stderr}"
    return result


def template_args() -> list[str]:
    return [
        "template",
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--kube-version",
        KUBE_VERSION,
    ]


def render(*args: str) -> list[dict[str, Any]]:
    out = helm(*template_args(), *args).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def find(docs: list[dict[str, Any]], kind: str, suffix: str = "") -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(suffix)]
    assert len(found) == 1, f"{kind} *{suffix}: {[d['metadata']['name'] for d in found]}"
    return found[0]


def render_notes(tmp_path: Path, *args: str) -> str:
    """NOTES.txt as `helm install` prints it: helm template leaves NOTES out, so a copy of the
    chart renders it into a ConfigMap."""
    chart = tmp_path / "gpushare"
    shutil.copytree(CHART, chart)
    (chart / "notes.txt").write_text((chart / "templates" / "NOTES.txt").read_text())
    (chart / "templates" / "zz-notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\n"
        'data:\n  notes: {{ tpl (.Files.Get "notes.txt") . | toJson }}\n'
    )
    out = helm("template", RELEASE, str(chart), "-n", NAMESPACE, "--kube-version", KUBE_VERSION,
               "--show-only", "templates/zz-notes.yaml", *args).stdout  # fmt: skip
    notes: str = yaml.safe_load(out)["data"]["notes"]
    return notes


def find_job(docs: list[dict[str, Any]], component: str) -> dict[str, Any]:
    """The one Job of a component (``seal``, ``webhook-certs``): its name ends in a hash of its
    spec (the chart's ``gpushare.jobName``), so it is found by its component label."""
    found = [
        d
        for d in docs
        if d["kind"] == "Job"
        and d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component
    ]
    assert len(found) == 1, f"Job {component}: {[d['metadata']['name'] for d in found]}"
    return found[0]
