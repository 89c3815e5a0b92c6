"""The one image recipe builds the arm64 image on an amd64 machine, and what it builds runs.

``packaging/image.py --arch arm64`` (``make image ARCH=arm64``, or ``ARCH=amd64,arm64`` for
one index of both; ``make release`` passes ARCH on) cross-compiles the interposer with
``aarch64-linux-gnu-gcc``, takes every dependency as an aarch64 wheel (``pip download
--platform``) and has mmdebstrap install Debian's arm64 packages, whose maintainer scripts run
under qemu-user through binfmt_misc. The image's layer is then checked: the OCI platform, the
machine of its ELF files (Python, the interposer), and ``gpushare --version`` run inside it under
qemu.

It takes minutes (the whole Debian install is emulated; 40 on this project's loaded 2-core
machine), so it runs only with ``GPUSHARE_IMAGE_ARM64=1`` on a machine that has what the build
needs (docs/helm.md says how to get each), and under ``CI=true`` with that flag a missing tool
is a failure. ``GPUSHARE_IMAGE_ARM64_ARCHIVE=PATH`` checks an archive ``make image ARCH=arm64``
already wrote instead of building one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from harness.image_archive import project_version, recipe_repository

REPO = Path(__file__).resolve().parents[3]
BINFMT = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")
AARCH64 = 183
"""ELF e_machine of AArch64."""


def missing() -> str:
    """What this machine lacks to build and run an arm64 image, or ''."""
    for tool in ("mmdebstrap", "arch-test", "aarch64-linux-gnu-gcc"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (docs/helm.md, the arm64 image)"
    if not BINFMT.exists() or "enabled" not in BINFMT.read_text():
        return "qemu-aarch64 is not registered in binfmt_misc (docs/helm.md, the arm64 image)"
    if os.geteuid() != 0:
        return "running the image's root filesystem needs chroot (root)"
    return ""


def elf_machine(data: bytes) -> int:
    """e_machine of a little-endian ELF file."""
    assert data[:4] == b"\x7fELF", "not an ELF file"
    return int.from_bytes(data[18:20], "little")


@pytest.mark.skipif(
    os.environ.get("GPUSHARE_IMAGE_ARM64") != "1",
    reason="builds an emulated arm64 image (minutes): set GPUSHARE_IMAGE_ARM64=1",
)
def test_the_recipe_builds_an_arm64_image_that_runs(tmp_path: Path) -> None:
    reason = missing()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    given = os.environ.get("GPUSHARE_IMAGE_ARM64_ARCHIVE")
    archive = Path(given) if given else tmp_path / "gpushare-arm64.oci.tar"
    if not given:
        done = subprocess.run(
            [sys.executable, "packaging/image.py", "--out", str(archive), "--arch", "arm64"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=3600,
            check=False,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    version = project_version()

    with tarfile.open(archive) as oci:

        def blob(digest: str) -> bytes:
            member = oci.extractfile("blobs/sha256/" + digest.removeprefix("sha256:"))
            assert member is not None
            return member.read()

        index_file = oci.extractfile("index.json")
        assert index_file is not None
        (named,) = json.load(index_file)["manifests"]  # the image index, under its name
        assert named["annotations"]["io.containerd.image.name"] == (
            f"{recipe_repository()}:{version}"
        )
        (entry,) = json.loads(blob(named["digest"]))["manifests"]
        assert entry["platform"] == {"architecture": "arm64", "os": "linux"}
        manifest = json.loads(blob(entry["digest"]))
        assert json.loads(blob(manifest["config"]["digest"]))["architecture"] == "arm64"
        (layer,) = manifest["layers"]
        (tmp_path / "layer.tar.gz").write_bytes(blob(layer["digest"]))

    root = tmp_path / "root"
    root.mkdir()
    with tarfile.open(tmp_path / "layer.tar.gz") as rootfs:
        rootfs.extractall(root, filter="tar")
    python = root / "usr/bin/python3.11"  # Debian bookworm's, which the recipe installs
    interposers = list(root.glob("usr/local/lib/python3*/dist-packages/gpushare/**/*.so"))
    machines = {p.name: elf_machine(p.read_bytes()[:20]) for p in [python, *interposers]}
    assert interposers and set(machines.values()) == {AARCH64}, machines

    ran = subprocess.run(
        ["chroot", "--userspec=65532:65532", str(root), "/usr/local/bin/gpushare", "--version"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert version in ran.stdout, ran.stdout
