"""The chart's images as archives ``ctr images import`` reads, built without a Docker engine.

These machines reach no image registry, so the real node cannot pull the chart's images. This
module makes the three images ``charts/gpushare`` runs from what they can reach (Debian
packages, PyPI and the control-plane build):

- the gpushare image, ``ghcr.io/gpushare/gpushare:<version>`` as the chart names it by default:
  built by the release's own recipe, ``packaging/image.py``, run with the same arguments as
  ``make image`` (``RECIPE``), so the image the Helm test runs is the one a release ships
  (``tests/unit/harness/test_image_archive.py`` checks that the Makefile and this module agree);
- ``gpushare.local/kube-scheduler:<version>``: the statically linked kube-scheduler that
  ``harness/controlplane/build.sh`` builds, as upstream's distroless image carries it (a
  stand-in for registry.k8s.io's, which a cluster pulls);
- ``gpushare.local/webhook-certs:1``: what the chart's certificate Job needs (``sh``,
  ``openssl``, coreutils' ``base64``/``seq``, ``kubectl``): Debian minbase with ``openssl``
  and the control plane's kubectl (a stand-in for ``alpine/k8s``).

The stand-ins are one-layer docker-archives (``manifest.json``, a config JSON, ``layer.tar``);
the gpushare image is the recipe's OCI archive. Each is cached under
``~/.cache/gpushare/images`` (``GPUSHARE_CACHE`` moves it) by a content hash of its inputs, so
a second build is a lookup.

    python -m harness.image_archive [--out DIR]     # make image-archive
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Documentation, manual pages and translations: nothing in a container reads them.
DPKG_EXCLUDES = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*", "/usr/share/locale/*")


ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64"}
"""The kernel's machine names as OCI names them."""


class ImageBuildError(RuntimeError):
    """A step of the image build failed; the message names the step and what to do."""


@dataclass(frozen=True)
class Account:
    """The non-root account a stand-in image runs as."""

    name: str
    uid: int
    gid: int
    shell: str


@dataclass(frozen=True)
class ImageDescription:
    """What a stand-in image promises: how it starts and as whom."""

    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    user: str
    workdir: str = ""
    env: tuple[tuple[str, str], ...] = ()
    """The image's own variables, without the base image's PATH."""
    exposed_ports: tuple[str, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    account: Account | None = None
    """The user the image runs as, written into its passwd and group files."""


RECIPE = "packaging/image.py"
"""The release's image recipe, run here as ``make image`` runs it."""
RECIPE_INPUTS = (
    "pyproject.toml", "constraints.txt", "README.md", "LICENSE", "CHANGELOG.md", "MANIFEST.in",
    "packaging", "src",
)  # fmt: skip
"""What the recipe reads: a change to any of them builds the gpushare image again."""


def project_version() -> str:
    """``version`` from pyproject.toml (the Makefile's VERSION)."""
    for line in (REPO / "pyproject.toml").read_text().splitlines():
        if line.startswith("version = "):
            return line.split("=", 1)[1].strip().strip('"')
    raise ImageBuildError("pyproject.toml has no `version = ...` line; add one")


def recipe_argv(python: str, out: Path) -> list[str]:
    """The command that builds the gpushare image: the Makefile's ``image`` target's."""
    return [python, RECIPE, "--out", str(out)]


def oci_config(image: ImageDescription, diff_id: str, created_by: str) -> dict[str, object]:
    """The image config JSON (docker/OCI) for one layer."""
    config: dict[str, object] = {
        "Env": [PATH_ENV, *(f"{k}={v}" for k, v in image.env)],
        "Entrypoint": list(image.entrypoint) or None,
        "Cmd": list(image.cmd) or None,
        "User": image.user,
        "WorkingDir": image.workdir,
        "Labels": dict(image.labels),
    }
    if image.exposed_ports:
        config["ExposedPorts"] = {port: {} for port in image.exposed_ports}
    return {
        # the binaries in it are this machine's
        "architecture": ARCHITECTURES.get(platform.machine(), platform.machine()),
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": created_by}],
    }


# -- writing archives ---------------------------------------------------------------------------


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    tar.addfile(info, io.BytesIO(data))


def write_archive(
    path: Path, tag: str, layer: Path, image: ImageDescription, created_by: str
) -> None:
    """A docker-archive at ``path`` with ``layer`` (a tar of the root filesystem) as its one
    layer; written beside and renamed, so a half-written archive is never reused."""
    diff_id = "sha256:" + _sha256_file(layer)
    config = json.dumps(oci_config(image, diff_id, created_by), sort_keys=True).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = [{"Config": config_name, "RepoTags": [tag], "Layers": ["layer.tar"]}]
    tmp = path.with_name(path.name + ".tmp")
    with tarfile.open(tmp, "w") as tar:
        tar.add(str(layer), arcname="layer.tar")
        _add_bytes(tar, config_name, config)
        _add_bytes(tar, "manifest.json", json.dumps(manifest).encode())
    tmp.replace(path)


def _accounts(account: Account) -> tuple[str, str]:
    """The /etc/passwd and /etc/group lines of ``account`` (Debian's files have root)."""
    passwd = f"{account.name}:x:{account.uid}:{account.gid}::/nonexistent:{account.shell}\n"
    group = f"{account.name}:x:{account.gid}:\n"
    return passwd, group


# -- inputs and the cache -----------------------------------------------------------------------


def inputs_hash(files: Iterable[Path], extra: Iterable[str] = ()) -> str:
    """A content hash of ``files`` (path and bytes) and ``extra`` strings."""
    digest = hashlib.sha256()
    for path in sorted(set(files)):
        digest.update(str(path.relative_to(REPO) if path.is_relative_to(REPO) else path).encode())
        digest.update(b"\0" + hashlib.sha256(path.read_bytes()).digest())
    for item in extra:
        digest.update(item.encode() + b"\0")
    return digest.hexdigest()[:16]


def _source_files() -> list[Path]:
    """The files of RECIPE_INPUTS, without build output (the stubs and the interposer are
    generated from the others)."""
    files: list[Path] = []
    for name in RECIPE_INPUTS:
        top = REPO / name
        for path in [top] if top.is_file() else sorted(top.rglob("*")):
            if (
                path.is_file()
                and "__pycache__" not in path.parts
                and ".egg-info" not in str(path)
                and not path.name.startswith("api_pb2")
                and path.suffix != ".so"
            ):
                files.append(path)
    return files


def _run(step: str, argv: list[str], *, fix: str, cwd: Path | None = None) -> None:
    result = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-25:])
        raise ImageBuildError(
            f"{step} failed (exit {result.returncode}): {' '.join(argv[:4])} ...\n{tail}\n{fix}"
        )


def _mmdebstrap(out: Path, packages: list[str], hooks: list[str]) -> None:
    """A Debian root filesystem tarball at ``out``: minbase plus ``packages``, then ``hooks``
    (mmdebstrap customize hooks, run with the root directory as ``$1``)."""
    if shutil.which("mmdebstrap") is None:
        raise ImageBuildError(
            "mmdebstrap is not installed: it makes the Debian root filesystem. "
            "Install it with `apt-get install -y mmdebstrap` (as root)."
        )
    argv = [
        "mmdebstrap",
        "--variant=minbase",
        "--mode=root" if os.geteuid() == 0 else "--mode=unshare",
        f"--include={','.join(packages)}",
        *(f"--dpkgopt=path-exclude={pattern}" for pattern in DPKG_EXCLUDES),
        "--aptopt=Acquire::Retries 3",
        *(f"--customize-hook={hook}" for hook in hooks),
        SUITE,
        str(out),
        MIRROR,
    ]
    _run(
        "mmdebstrap",
        argv,
        fix="It needs root (or unprivileged user namespaces) and deb.debian.org.",
    )


@dataclass
class Builder:
    """Builds (or finds in the cache) the chart's images."""

    cache: Path
    binaries: dict[str, Path] = field(default_factory=dict)
    python: str = sys.executable
    progress: bool = False

    def _say(self, text: str) -> None:
        if self.progress:
            print(f"[image-archive] {text}", flush=True)

    def _cached(self, name: str, key: str) -> Path:
        """Where the archive for these inputs lives; archives of older inputs are removed
        (hundreds of MiB each, never read again)."""
        self.cache.mkdir(parents=True, exist_ok=True)
        path = self.cache / f"{name}-{key}.tar"
        for old in self.cache.glob(f"{name}-*.tar"):
            if old != path and old.name.removeprefix(f"{name}-")[:-4].isalnum():
                old.unlink()
        return path

    # -- gpushare -------------------------------------------------------------------------------

    def gpushare(self) -> tuple[str, Path]:
        """The gpushare image as a release builds it: (its name, the OCI archive)."""
        version = project_version()
        tag = f"{recipe_repository()}:{version}"
        key = inputs_hash(_source_files(), [version])
        archive = self._cached("gpushare-oci", key)
        if archive.exists():
            self._say(f"{tag}: cached {archive}")
            return tag, archive
        self._say(f"{tag}: building with {RECIPE} (wheels, then a Debian root filesystem)")
        _run(
            RECIPE,
            recipe_argv(self.python, archive),
            fix=f"Run `make image` to see the whole output ({RECIPE} says what it needs).",
            cwd=REPO,
        )
        self._say(f"{tag}: {archive} ({archive.stat().st_size >> 20} MiB)")
        return tag, archive

    # -- kube-scheduler and the certificate Job ---------------------------------------------------

    def kube_scheduler(self) -> tuple[str, Path]:
        """kube-scheduler alone (a static binary), user 65532 as upstream's distroless image."""
        binary = self.binaries["kube-scheduler"]
        version = binary.parent.name.removeprefix("kubernetes-")
        tag = f"gpushare.local/kube-scheduler:{version}"
        image = ImageDescription(
            entrypoint=("/usr/local/bin/kube-scheduler",),
            cmd=(),
            user="65532:65532",
            account=Account(name="nonroot", uid=65532, gid=65532, shell="/sbin/nologin"),
        )
        key = inputs_hash([binary, Path(__file__)], [repr(image)])
        archive = self._cached("kube-scheduler", key)
        if archive.exists():
            self._say(f"{tag}: cached {archive}")
            return tag, archive
        assert image.account is not None
        passwd, group = _accounts(image.account)
        with tempfile.TemporaryDirectory(prefix="gpushare-image-") as tmp:
            layer = Path(tmp) / "layer.tar"
            with tarfile.open(layer, "w", format=tarfile.GNU_FORMAT) as tar:
                for directory, mode in (("etc", 0o755), ("tmp", 0o1777), ("usr", 0o755)):
                    info = tarfile.TarInfo(directory)
                    info.type, info.mode = tarfile.DIRTYPE, mode
                    tar.addfile(info)
                for directory in ("usr/local", "usr/local/bin"):
                    info = tarfile.TarInfo(directory)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
                _add_bytes(
                    tar, "etc/passwd", ("root:x:0:0:root:/:/sbin/nologin\n" + passwd).encode()
                )
                _add_bytes(tar, "etc/group", ("root:x:0:\n" + group).encode())
                _add_bytes(tar, "usr/local/bin/kube-scheduler", binary.read_bytes(), 0o755)
            write_archive(archive, tag, layer, image, "kube-scheduler from controlplane/build.sh")
        self._say(f"{tag}: {archive}")
        return tag, archive

    def webhook_certs(self) -> tuple[str, Path]:
        """sh, openssl, coreutils and kubectl: what the chart's certificate Job runs."""
        kubectl = self.binaries["kubectl"]
        tag = "gpushare.local/webhook-certs:1"
        image = ImageDescription(
            entrypoint=(),
            cmd=("/bin/sh",),
            user="65532:65532",
            account=Account(name="certs", uid=65532, gid=65532, shell="/usr/sbin/nologin"),
        )
        key = inputs_hash([kubectl, Path(__file__)], [SUITE, *DPKG_EXCLUDES, repr(image)])
        archive = self._cached("webhook-certs", key)
        if archive.exists():
            self._say(f"{tag}: cached {archive}")
            return tag, archive
        self._say(f"{tag}: building (Debian minbase, openssl, kubectl)")
        assert image.account is not None
        passwd, group = _accounts(image.account)
        with tempfile.TemporaryDirectory(prefix="gpushare-image-") as tmp:
            work = Path(tmp)
            (work / "passwd").write_text(passwd)
            (work / "group").write_text(group)
            rootfs = work / "rootfs.tar"
            _mmdebstrap(
                rootfs,
                ["openssl"],
                [
                    f'install -m 0755 {kubectl} "$1/usr/local/bin/kubectl"',
                    f'cat {work / "passwd"} >> "$1/etc/passwd"',
                    f'cat {work / "group"} >> "$1/etc/group"',
                    'rm -rf "$1/var/lib/apt/lists"/* "$1/var/cache/apt"/*',
                ],
            )
            write_archive(archive, tag, rootfs, image, "webhook-certs harness/image_archive.py")
        self._say(f"{tag}: {archive} ({archive.stat().st_size >> 20} MiB)")
        return tag, archive

    def all(self) -> dict[str, Path]:
        """Every image: tag -> archive."""
        return dict([self.gpushare(), self.kube_scheduler(), self.webhook_certs()])


def recipe_repository() -> str:
    """The repository the recipe names its image (``REPOSITORY`` in packaging/image.py), read
    from the file: the directory ``packaging`` is not importable beside pip's ``packaging``."""
    for line in (REPO / RECIPE).read_text().splitlines():
        if line.startswith("REPOSITORY = "):
            return line.split("=", 1)[1].strip().strip('"')
    raise ImageBuildError(f"{RECIPE} has no `REPOSITORY = ...` line")


def default_cache() -> Path:
    """``$GPUSHARE_CACHE/images`` (default ``~/.cache/gpushare/images``), as images.py uses."""
    return Path(os.environ.get("GPUSHARE_CACHE", Path.home() / ".cache" / "gpushare")) / "images"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=default_cache(), help="cache directory")
    args = parser.parse_args()
    from harness.cluster import build_binaries

    builder = Builder(cache=args.out, binaries=build_binaries(), progress=True)
    try:
        built = builder.all()
    except ImageBuildError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
    for tag, archive in built.items():
        print(f"{tag}\t{archive}")
    print("import with: ctr -n k8s.io images import ARCHIVE")


if __name__ == "__main__":
    main()
