"""The Kubernetes releases the e2e tests build, and the minimum the chart and the docs state.

The oldest supported minor is claimed in three places (Chart.yaml's ``kubeVersion``,
docs/compatibility.md, ``make e2e-oldest``) and proven by one build (a
``harness/controlplane/kubernetes-1.<minor>/`` module); these tests keep the four saying the
same thing, and each pinned module consistent with itself, so that a bump of one cannot leave
the proof running on another release than the one claimed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from harness.cluster import K8S_VERSION_ENV, build_env

REPO = Path(__file__).resolve().parents[3]
CONTROLPLANE = REPO / "harness" / "controlplane"
BUILD_SH = CONTROLPLANE / "build.sh"
MODULES = sorted(CONTROLPLANE.glob("kubernetes*/go.mod"))
RELEASE = re.compile(r"^v1\.(\d+)\.(\d+)$")


def pinned_release(go_mod: Path) -> str:
    """The k8s.io/kubernetes release a module directory's go.mod requires."""
    found = re.search(r"^require k8s\.io/kubernetes (v\S+)$", go_mod.read_text(), re.MULTILINE)
    assert found, f"{go_mod}: no `require k8s.io/kubernetes vX.Y.Z` line; build.sh finds it so"
    return found.group(1)


def minor(release: str) -> int:
    matched = RELEASE.match(release)
    assert matched, f"{release!r} is not a Kubernetes release vMAJOR.MINOR.PATCH"
    return int(matched.group(1))


def oldest_release() -> str:
    return min((pinned_release(m) for m in MODULES), key=minor)


def test_there_are_two_pinned_releases_the_newest_and_the_oldest() -> None:
    assert [m.parent.name for m in MODULES] == ["kubernetes", "kubernetes-1.30"]
    newest = pinned_release(CONTROLPLANE / "kubernetes" / "go.mod")
    assert minor(newest) > minor(oldest_release())
    assert f'K8S_VERSION="${{K8S_VERSION:-{newest}}}"' in BUILD_SH.read_text()


@pytest.mark.parametrize("go_mod", MODULES, ids=lambda p: p.parent.name)
def test_every_staging_module_is_replaced_at_the_same_patch(go_mod: Path) -> None:
    """k8s.io/kubernetes leaves its staging modules as local paths; the module must replace each
    with the published k8s.io/<name> v0.<minor>.<patch> of the same patch, or it mixes
    releases."""
    release = pinned_release(go_mod)
    staging = "v0" + release.removeprefix("v1")
    replaced = re.findall(r"^\s*(k8s\.io/\S+) => (k8s\.io/\S+) (\S+)$", go_mod.read_text(), re.M)
    assert len(replaced) >= 25, f"{go_mod}: only {len(replaced)} replace directives"
    for name, target, version in replaced:
        assert name == target, f"{go_mod}: {name} replaced by another module {target}"
        assert version == staging, f"{go_mod}: {name} at {version}, not {staging} of {release}"
    if go_mod.parent.name != "kubernetes":
        assert go_mod.parent.name == f"kubernetes-1.{minor(release)}", (
            f"{go_mod}: the directory of a pinned older release is named after its minor"
        )
        assert (go_mod.parent / "go.sum").is_file()
        tools = (go_mod.parent / "tools.go").read_text()
        for command in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet"):
            assert f'"k8s.io/kubernetes/cmd/{command}"' in tools


def test_the_chart_the_docs_and_the_make_target_name_the_oldest_pinned_minor() -> None:
    oldest = oldest_release()
    chart = yaml.safe_load((REPO / "charts" / "gpushare" / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == f">=1.{minor(oldest)}.0-0"
    docs = (REPO / "docs" / "compatibility.md").read_text()
    assert f"**Kubernetes 1.{minor(oldest)} and later**" in docs
    assert oldest in docs
    makefile = (REPO / "Makefile").read_text()
    assert re.search(rf"^OLDEST_K8S \?= {re.escape(oldest)}$", makefile, re.M), (
        "the Makefile's OLDEST_K8S must be the oldest pinned release"
    )
    assert "(docs/compatibility.md)" in (REPO / "README.md").read_text()


def test_the_e2e_cluster_takes_the_release_from_its_own_variable_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("K8S_VERSION", "v1.29.0")
    monkeypatch.delenv(K8S_VERSION_ENV, raising=False)
    assert "K8S_VERSION" not in build_env(), "a stray K8S_VERSION must not pick the release"
    monkeypatch.setenv(K8S_VERSION_ENV, " v1.30.14 ")
    env = build_env()
    assert env["K8S_VERSION"] == "v1.30.14"
    assert env[K8S_VERSION_ENV] == " v1.30.14 "


@pytest.mark.skipif(shutil.which("go") is None, reason="build.sh asks go for its version first")
def test_build_sh_refuses_a_release_no_module_pins_before_building(tmp_path: Path) -> None:
    result = subprocess.run(
        ["bash", str(BUILD_SH)],
        env={**os.environ, "K8S_VERSION": "v1.29.15", "GPUSHARE_CACHE": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert "K8S_VERSION=v1.29.15: no go.mod" in result.stderr
    for release in (pinned_release(m) for m in MODULES):
        assert release in result.stderr, "the refusal lists the releases that are pinned"
    assert result.stdout == ""
    assert not any(tmp_path.iterdir()), "nothing is built or cached for a refused release"
