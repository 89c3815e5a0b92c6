"""The image the e2e tests run is the image a release ships: one recipe, packaging/image.py.

``make image`` runs the recipe; the real-node Helm test's builder (harness/image_archive.py)
runs the same command and imports the archive it writes. These tests hold the two to one
command, check what the recipe writes (an OCI image layout naming the release's repository and
version, the image config per architecture) and that no architecture is built in.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from harness import image_archive
from harness.image_archive import RECIPE, Builder, project_version, recipe_argv

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def recipe() -> Iterator[ModuleType]:
    """packaging/image.py as a module (``packaging`` itself is pip's package, so by path)."""
    sys.path.insert(0, str(REPO / "packaging"))
    try:
        yield importlib.import_module("image")
    finally:
        sys.path.remove(str(REPO / "packaging"))


def make_dry_run(*args: str) -> list[str]:
    """The commands ``make -n`` would run, one per line."""
    done = subprocess.run(
        ["make", "-n", "--no-print-directory", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.splitlines()


def test_make_image_and_the_e2e_builder_run_one_command() -> None:
    (line,) = make_dry_run("image", "PYTHON=python3", "IMAGE_ARCHIVE=out.tar")
    assert line.split() == recipe_argv("python3", Path("out.tar"))
    assert recipe_argv("python3", Path("out.tar"))[1] == RECIPE == "packaging/image.py"


def test_make_image_passes_the_architectures() -> None:
    (line,) = make_dry_run("image", "PYTHON=python3", "IMAGE_ARCHIVE=o.tar", "ARCH=amd64,arm64")
    assert line.split()[-2:] == ["--arch", "amd64,arm64"]


def test_the_e2e_builder_builds_by_the_recipe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a cached archive the builder runs the recipe's command and nothing else."""
    ran: list[list[str]] = []

    def run(step: str, argv: list[str], *, fix: str, cwd: Path | None = None) -> None:
        ran.append(argv)
        Path(argv[argv.index("--out") + 1]).write_bytes(b"archive")

    monkeypatch.setattr(image_archive, "_run", run)
    tag, archive = Builder(cache=tmp_path, python="py").gpushare()
    assert ran == [recipe_argv("py", archive)]
    assert tag == f"ghcr.io/gpushare/gpushare:{project_version()}"
    assert Builder(cache=tmp_path, python="py").gpushare() == (tag, archive)
    assert len(ran) == 1, "a second build with the same inputs is a lookup"


def test_the_builder_reads_the_recipes_repository(recipe: ModuleType) -> None:
    assert image_archive.recipe_repository() == recipe.REPOSITORY


def test_every_architecture_has_its_own_names(recipe: ModuleType) -> None:
    arm = recipe.parse_arches("arm64")[0]
    assert (arm.debian, arm.machine) == ("arm64", "aarch64")
    assert all(tag.endswith("_aarch64") for tag in recipe.platform_tags(arm))
    assert [a.debian for a in recipe.parse_arches("amd64, arm64")] == ["amd64", "arm64"]
    with pytest.raises(recipe.RecipeError, match=r"--arch 'riscv64': not one of amd64, arm64"):
        recipe.parse_arches("riscv64")
    assert recipe.config("1", arm, "t")["architecture"] == "arm64"


def test_the_archive_is_an_oci_layout_naming_the_release(
    recipe: ModuleType, tmp_path: Path
) -> None:
    layers = {}
    for arch in ("amd64", "arm64"):
        layer = tmp_path / f"{arch}.tar"
        with tarfile.open(layer, "w") as tar:
            tar.add(str(REPO / "LICENSE"), arcname="LICENSE")
        layers[arch] = layer
    out = tmp_path / "image.oci.tar"
    recipe.write_oci(out, "ghcr.io/gpushare/gpushare", "9.9.9", layers, "2026-01-01T00:00:00Z")
    with tarfile.open(out) as tar:

        def blob(digest: str) -> bytes:
            member = tar.extractfile("blobs/sha256/" + digest.removeprefix("sha256:"))
            assert member is not None
            return member.read()

        layout = tar.extractfile("oci-layout")
        assert layout is not None and json.load(layout) == {"imageLayoutVersion": "1.0.0"}
        top = tar.extractfile("index.json")
        assert top is not None
        (named,) = json.load(top)["manifests"]
        assert named["annotations"] == {
            "io.containerd.image.name": "ghcr.io/gpushare/gpushare:9.9.9",
            "org.opencontainers.image.ref.name": "9.9.9",
        }
        index = json.loads(blob(named["digest"]))
        platforms = [m["platform"]["architecture"] for m in index["manifests"]]
        assert platforms == ["amd64", "arm64"]
        for entry in index["manifests"]:
            manifest = json.loads(blob(entry["digest"]))
            config = json.loads(blob(manifest["config"]["digest"]))
            assert config["architecture"] == entry["platform"]["architecture"]
            assert config["config"]["Entrypoint"] == ["gpushare"]
            assert config["config"]["User"] == "65532:65532"
            assert config["config"]["Labels"]["org.opencontainers.image.version"] == "9.9.9"
            (layer,) = manifest["layers"]
            assert len(blob(layer["digest"])) == layer["size"]


def test_the_cache_key_covers_what_the_recipe_builds_from(recipe: ModuleType) -> None:
    assert set(recipe.SOURCES) | {"packaging"} <= set(image_archive.RECIPE_INPUTS)
