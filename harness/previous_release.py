"""The previous release's chart and image, rebuilt from the commit it was made from.

No release has been published to a registry these machines can reach, so the upgrade test
cannot pull the previous one. It rebuilds it instead, reproducibly: ``git archive`` of the
pinned commit (``PREVIOUS``) into a temporary directory, then that commit's own recipe
(``packaging/image.py``, as ``make image`` ran it then) and ``helm package`` of that commit's
chart. What comes out is what ``make release`` made at that commit, not the working tree's
idea of it. Both are cached under ``~/.cache/gpushare/images`` by version and commit, so only
the first run pays for the image (about as long as ``make image``).

    python -m harness.previous_release      # build (or find) it and print where
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.image_archive import REPO, ImageBuildError, default_cache


@dataclass(frozen=True)
class Release:
    """A release this repository made: its version and the commit that made it."""

    version: str
    commit: str


PREVIOUS = Release(version="0.1.0", commit="73ebc97e062505d823152a274d2c23e2e460752d")
"""The release the working chart upgrades from (0.1.0 as shipped)."""


@dataclass(frozen=True)
class Built:
    """The previous release's artifacts: the packaged chart and the image archive."""

    release: Release
    chart: Path
    image: Path

    @property
    def image_name(self) -> str:
        return f"ghcr.io/gpushare/gpushare:{self.release.version}"

    def fit_values(self, values: dict[str, Any]) -> dict[str, Any]:
        """``values`` less the keys this release's schema does not know.

        The release's ``values.schema.json`` refuses unknown keys (``additionalProperties:
        false``), so values written for the working chart (a key added since, such as
        ``devicePlugin.criSocketPath``) would stop its install. A user upgrading carries the
        values their installed release accepted; this gives the test the same."""
        with tarfile.open(self.chart) as tar:
            member = tar.extractfile("gpushare/values.schema.json")
            if member is None:
                raise ImageBuildError(f"{self.chart} holds no gpushare/values.schema.json")
            schema = json.load(member)
        fitted: dict[str, Any] = _fit(values, schema)
        return fitted


def _fit(value: Any, schema: dict[str, Any]) -> Any:
    """``value`` pruned to what ``schema`` allows where it closes its properties."""
    if not isinstance(value, dict):
        return value
    properties: dict[str, Any] = schema.get("properties", {})
    closed = schema.get("additionalProperties") is False
    return {
        key: _fit(item, properties.get(key, {}))
        for key, item in value.items()
        if key in properties or not closed
    }


def _run(step: str, argv: list[str], *, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-25:])
        command = " ".join(argv[:4])
        raise ImageBuildError(f"{step} failed (exit {done.returncode}): {command}\n{tail}")
    return done.stdout


def _checkout(release: Release, into: Path) -> None:
    """The commit's tree, as ``git archive`` gives it (no working-tree files, no .git)."""
    known = subprocess.run(
        ["git", "cat-file", "-e", f"{release.commit}^{{commit}}"], cwd=REPO, check=False
    )
    if known.returncode != 0:
        raise ImageBuildError(
            f"commit {release.commit} (release {release.version}) is not in this clone: "
            "fetch the whole history (git fetch --unshallow, or CI's fetch-depth: 0)"
        )
    archive = into.with_suffix(".tar")
    _run("git archive", ["git", "archive", "-o", str(archive), release.commit], cwd=REPO)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    archive.unlink()


def build(
    helm: str,
    *,
    release: Release = PREVIOUS,
    cache: Path | None = None,
    python: str = sys.executable,
    progress: bool = False,
) -> Built:
    """The release's chart and image, from the cache or built from its commit."""
    cache = cache or default_cache()
    cache.mkdir(parents=True, exist_ok=True)
    stem = f"release-{release.version}-{release.commit[:12]}"
    image = cache / f"{stem}.oci.tar"
    chart = cache / stem / f"gpushare-{release.version}.tgz"
    if image.exists() and chart.exists():
        return Built(release, chart, image)
    with tempfile.TemporaryDirectory(prefix="gpushare-previous-") as tmp:
        tree = Path(tmp) / "tree"
        tree.mkdir()
        _checkout(release, tree)
        epoch = _run("git log", ["git", "log", "-1", "--format=%ct", release.commit], cwd=REPO)
        env = {**os.environ, "SOURCE_DATE_EPOCH": epoch.strip()}
        if not chart.exists():
            chart.parent.mkdir(parents=True, exist_ok=True)
            _run(
                "helm package",
                [helm, "package", str(tree / "charts" / "gpushare"), "-d", str(chart.parent)],
                cwd=tree,
            )
        if not image.exists():
            if progress:
                print(f"[previous] {release.version}: image from {release.commit[:12]}", flush=True)
            partial = image.with_name(image.name + ".tmp")
            _run(
                "packaging/image.py (previous release)",
                [python, "packaging/image.py", "--out", str(partial)],
                cwd=tree,
                env=env,
            )
            partial.replace(image)
    if not chart.exists():
        raise ImageBuildError(f"helm package of {release.commit[:12]} made no {chart.name}")
    return Built(release, chart, image)


def main() -> None:
    from harness.cluster import build_binaries

    try:
        built = build(str(build_binaries()["helm"]), progress=True)
    except ImageBuildError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
    print(f"{built.image_name}\t{built.image}\n{built.chart}")


if __name__ == "__main__":
    main()
