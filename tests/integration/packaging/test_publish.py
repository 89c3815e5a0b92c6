"""Publishing a release: the forge's workflow and the dry run read one list of steps.

``.github/workflows/release.yml`` must run exactly packaging/publish.py's STEPS, in order, each
as ``make release-step-<name>``, with its actions pinned by commit and the least permissions;
the SBOM is read back from an image archive's layers; and the dry run pushes a (small) image
and the chart to ``crane registry serve`` on 127.0.0.1 with the very commands the workflow
runs, and pulls both back. No network: the registry is local, and the tools are the cached ones
of packaging/tools.sh (skipped when not built, failed under CI=true, where the Go module proxy
builds them).
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from harness.image_archive import project_version
from tests.support.releasetools import packaging_module, release_tools

REPO = Path(__file__).resolve().parents[3]
WORKFLOW = REPO / ".github" / "workflows" / "release.yml"


_packaging = packaging_module


publish = _packaging("publish")
sbom = _packaging("sbom")
image = _packaging("image")


def _workflow() -> dict[str, object]:
    loaded = yaml.safe_load(WORKFLOW.read_text())
    assert isinstance(loaded, dict)
    return loaded


def _steps() -> list[dict[str, object]]:
    (job,) = _workflow()["jobs"].values()  # type: ignore[attr-defined]
    return list(job["steps"])


def test_the_workflow_runs_the_one_list_of_steps_in_order() -> None:
    """Every publishing command is a step of packaging/publish.py, which the dry run runs too:
    nothing the workflow does is missing from the rehearsal."""
    runs = [str(step["run"]).strip() for step in _steps() if "run" in step]
    made = [r.removeprefix("make release-step-") for r in runs if r.startswith("make release-")]
    assert made == [step.name for step in publish.STEPS]
    # the rest only installs tools: no push, sign or release outside the list
    others = " ".join(r for r in runs if not r.startswith("make release-"))
    for verb in ("push", "cosign", "gh release", "oras cp", "login"):
        assert verb not in others, f"{verb!r} outside packaging/publish.py"
    # the Makefile's target is the one the workflow calls
    assert (
        "release-step-%: $(STAMP)\n\t$(BIN)/python packaging/publish.py $*"
        in (REPO / "Makefile").read_text()
    )


def test_the_workflow_runs_on_version_tags_with_the_least_permissions() -> None:
    workflow = _workflow()
    # PyYAML reads the key `on` as True (YAML 1.1)
    assert workflow[True] == {"push": {"tags": ["v*"]}}  # type: ignore[index]
    assert workflow["permissions"] == {}
    (job,) = workflow["jobs"].values()  # type: ignore[attr-defined]
    assert job["permissions"] == {"contents": "write", "packages": "write", "id-token": "write"}
    tokens = [s for s in _steps() if "secrets." in json.dumps(s)]
    assert [s["run"] for s in tokens] == [
        "make release-step-login",
        "make release-step-github-release",
    ]


def test_every_action_is_pinned_by_commit() -> None:
    uses = [str(step["uses"]) for step in _steps() if "uses" in step]
    assert uses, "the workflow uses no action?"
    for use in uses:
        assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", use), f"{use}: pin a commit SHA"
    text = WORKFLOW.read_text()
    for use in uses:  # and says which release that commit is
        assert re.search(re.escape(use) + r" # v\d+\.\d+\.\d+", text), use


def test_a_debian_snapshot_is_a_timestamp_and_pins_the_mirror() -> None:
    assert image.debian_mirror("") == (image.MIRROR, [])
    mirror, options = image.debian_mirror(publish.DEBIAN_SNAPSHOT)
    assert mirror == f"http://snapshot.debian.org/archive/debian/{publish.DEBIAN_SNAPSHOT}"
    assert options == ["--aptopt=Acquire::Check-Valid-Until false"]
    with pytest.raises(image.RecipeError, match=r"--snapshot '2026-12-01': not a snapshot"):
        image.debian_mirror("2026-12-01")


# -- the SBOM and the dry run, on a small image made by the recipe's own OCI writer ----------------

DPKG_STATUS = """\
Package: python3
Status: install ok installed
Architecture: amd64
Version: 3.11.2-1+b1

Package: removed-one
Status: deinstall ok config-files
Version: 1.0
"""
METADATA = (
    "Metadata-Version: 2.4\nName: kube-gpushare\nVersion: {v}\nLicense-Expression: Apache-2.0\n"
)


def _small_image(tmp: Path, version: str) -> Path:
    """An OCI archive of the recipe's shape (write_oci) whose layer holds dpkg's and pip's
    records, and nothing else."""
    layer = tmp / "rootfs.tar"
    with tarfile.open(layer, "w") as tar:
        for name, text in (
            ("./var/lib/dpkg/status", DPKG_STATUS),
            (
                f"./usr/local/lib/python3.11/dist-packages/kube_gpushare-{version}.dist-info/METADATA",
                METADATA.format(v=version),
            ),
        ):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    out = tmp / "small.oci.tar"
    image.write_oci(out, image.REPOSITORY, version, {"amd64": layer}, "2026-12-01T00:00:00Z")
    return out


def test_the_sbom_lists_what_the_layers_record(tmp_path: Path) -> None:
    version = project_version()
    archive = _small_image(tmp_path, version)
    document = sbom.document(
        archive, f"ghcr.io/gpushare/gpushare:{version}", "2026-12-01T00:00:00Z"
    )
    assert document["spdxVersion"] == "SPDX-2.3"
    packages = {p["name"]: p for p in document["packages"]}  # type: ignore[attr-defined]
    assert set(packages) == {f"ghcr.io/gpushare/gpushare:{version}", "python3", "kube-gpushare"}
    refs = {
        p["externalRefs"][0]["referenceLocator"] for p in packages.values() if "externalRefs" in p
    }
    assert refs == {
        "pkg:deb/debian/python3@3.11.2-1+b1?arch=amd64",
        f"pkg:pypi/kube-gpushare@{version}",
    }
    assert packages["kube-gpushare"]["licenseDeclared"] == "Apache-2.0"
    contains = [r for r in document["relationships"] if r["relationshipType"] == "CONTAINS"]  # type: ignore[attr-defined]
    assert len(contains) == 2


def test_an_archive_without_dpkg_records_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "rootfs.tar"
    tarfile.open(empty, "w").close()
    archive = tmp_path / "empty.oci.tar"
    image.write_oci(archive, image.REPOSITORY, "0.0.0", {"amd64": empty}, "2026-12-01T00:00:00Z")
    with pytest.raises(sbom.SbomError, match="no var/lib/dpkg/status in any layer"):
        sbom.packages(archive)


def test_the_dry_run_pushes_and_pulls_back_with_the_workflows_commands(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every step but `build` (the image recipe and the wheels need Debian's archive and PyPI;
    `make release-dryrun` runs it too) against a local registry: the image by its index digest,
    the chart pulled back at its version; signing and the GitHub release shown, not run."""
    tools = {name: str(path) for name, path in release_tools("oras", "crane", "helm").items()}
    version = project_version()
    dist = tmp_path / version
    dist.mkdir()
    archive = _small_image(tmp_path, version)
    (dist / f"gpushare-image-{version}.oci.tar").write_bytes(archive.read_bytes())
    subprocess.run(
        [tools["helm"], "package", str(REPO / "charts" / "gpushare"), "-d", str(dist)],
        check=True, capture_output=True,
    )  # fmt: skip
    (dist / "SHA256SUMS").write_text("")
    ctx = publish.Context(
        version=version, dist=dist, registry="unused", dry_run=True, arches="amd64",
        tools=dict(tools),
    )  # fmt: skip
    steps = [s for s in publish.STEPS if s.name != "build"]
    assert publish.dry_run(ctx, steps) == 0
    shown = capsys.readouterr().out
    # the registry's digest of the pushed index is the archive's (push-image checks it too)
    want = (dist / "image-digest").read_text().strip()
    assert want == publish._archive_digest(archive)
    assert re.search(r"\[run\] \S+/oras cp --from-oci-layout \S+:" + re.escape(version), shown)
    assert f"[run] {tools['helm']} push {dist}/gpushare-" in shown
    # what only the forge can do is named, with the reason
    assert re.search(
        r"\[skip\] cosign sign --yes 127\.0\.0\.1:\d+/gpushare/gpushare@" + want, shown
    )
    assert "[skip] cosign attest --yes --type spdxjson --predicate" in shown
    assert f"[skip] gh release create v{version} --verify-tag" in shown
    assert "keyless signing needs the forge's OIDC token" in shown
    sums = (dist / "SHA256SUMS").read_text()
    assert f"gpushare-image-{version}.spdx.json" in sums
