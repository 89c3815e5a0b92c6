"""The gpushare container image: the one recipe that releases ship and the e2e tests run.

    python3 packaging/image.py --out dist/gpushare-0.1.0.oci.tar [--arch amd64,arm64]

``make image`` runs it, ``make release`` ships what it writes, and the real-node Helm test
(``harness/image_archive.py``) runs the same command and imports the same archive, so the image
a user builds is the image that was tested. It needs no image registry, only Debian's archive
and PyPI, and ordinary tools: ``mmdebstrap`` (root, or unprivileged user namespaces), Python
3.11 with pip, and gcc for the CUDA interposer. Where those are missing, run it inside a Debian
container (``make image-in-docker``) and load the result with ``docker load``, ``podman load``
or ``skopeo copy oci-archive:...``.

For each architecture the image is one layer:

1. the wheels: gpushare's own (``pip wheel --no-deps .``; the build backend generates the gRPC
   stubs and compiles the interposer with ``$CC``, a cross compiler for a foreign architecture)
   and every runtime dependency as a binary wheel for that architecture, at the versions
   ``constraints.txt`` pins (``pip download --platform``), so nothing is compiled but our own C;
2. a Debian bookworm root filesystem (``mmdebstrap --variant=minbase``, Debian's python3 3.11;
   from deb.debian.org, or Debian's archive as it was at ``--snapshot``, which releases pin),
   into which those wheels are installed offline, plus the non-root ``gpushare`` account
   (uid/gid 65532); a foreign architecture runs its installers under qemu-user (binfmt_misc);
3. an OCI image layout in one tar: an image index (one manifest per architecture) named
   ``REPOSITORY:VERSION``, the layers gzip-compressed.

Only this file says how the image starts (``CONFIG``); the chart picks the subcommand.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REPOSITORY = "ghcr.io/gpushare/gpushare"
"""Where a release pushes the image; the chart's default image.registry/image.repository."""
DISTRIBUTION = "kube-gpushare"
"""The distribution's name on PyPI (``gpushare`` there is another project's); the import name
stays ``gpushare``."""
WHEEL_NAME = DISTRIBUTION.replace("-", "_")
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
SNAPSHOT_MIRROR = "http://snapshot.debian.org/archive/debian/{stamp}"
"""Debian's archive as it was at one moment (``--snapshot 20261201T000000Z``): a release pins one,
so rebuilding a tag installs the same Debian packages; ``deb.debian.org`` moves on every point
release and security update."""
SNAPSHOT_STAMP = re.compile(r"\d{8}T\d{6}Z")
PYTHON = "3.11"
"""Debian bookworm's python3, which the wheels are chosen for."""
GLIBC_MINOR = 36
"""Debian bookworm's glibc 2.36: the newest manylinux tag its python3 can load."""
DEB_PACKAGES = ("python3", "python-is-python3")
"""python-is-python3: ``python`` as well as ``python3`` (the chart's probes run ``python``)."""
DPKG_EXCLUDES = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*", "/usr/share/locale/*")
"""Documentation, manual pages and translations: nothing in a container reads them."""
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SITE_PACKAGES = "usr/local/lib/python3.11/dist-packages"
INTERPOSER = "gpushare/isolation/native/libgpushare-cuda.so"
MOUNTCHECK = "gpushare/isolation/native/gpushare-mountcheck"
NATIVE_FILES = (INTERPOSER, MOUNTCHECK)
"""The native files the wheel must carry: the interposer, and the runtime hook."""
UID = GID = 65532
ACCOUNT = f"gpushare:x:{UID}:{GID}::/nonexistent:/usr/sbin/nologin\n"
GROUP = f"gpushare:x:{GID}:\n"


@dataclass(frozen=True)
class Arch:
    """One target architecture, in the names each tool uses for it."""

    debian: str
    """dpkg's and OCI's name (amd64, arm64)."""
    machine: str
    """The kernel's and manylinux's name (x86_64, aarch64)."""
    triplet: str
    """The GNU triplet, the prefix of its cross compiler."""


ARCHES = {
    "amd64": Arch("amd64", "x86_64", "x86_64-linux-gnu"),
    "arm64": Arch("arm64", "aarch64", "aarch64-linux-gnu"),
}


def config(version: str, arch: Arch, created: str) -> dict[str, object]:
    """What the image promises: how it starts, as whom, its labels (without the layers)."""
    return {
        "created": created,
        "architecture": arch.debian,
        "os": "linux",
        "config": {
            "Env": [
                PATH_ENV,
                "PIP_NO_CACHE_DIR=1",
                "PIP_DISABLE_PIP_VERSION_CHECK=1",
                "PYTHONDONTWRITEBYTECODE=1",
                "PYTHONUNBUFFERED=1",
            ],
            "Entrypoint": ["gpushare"],
            "Cmd": ["--help"],
            "User": f"{UID}:{GID}",
            "Labels": {
                "org.opencontainers.image.title": "gpushare",
                "org.opencontainers.image.description": (
                    "Shared GPU scheduling for Kubernetes (aliyun.com/gpu-mem)"
                ),
                "org.opencontainers.image.version": version,
                "org.opencontainers.image.licenses": "Apache-2.0",
                "org.opencontainers.image.source": "https://github.com/gpushare/gpushare",
            },
        },
    }


class RecipeError(RuntimeError):
    """A step failed; the message names the step and what to do."""


def project_version() -> str:
    """``version`` from pyproject.toml: the one version source of a release."""
    for line in (REPO / "pyproject.toml").read_text().splitlines():
        if line.startswith("version = "):
            return line.split("=", 1)[1].strip().strip('"')
    raise RecipeError("pyproject.toml has no `version = ...` line; add one")


def host_arch() -> Arch:
    """The architecture of this machine, or an error naming the supported ones."""
    machine = platform.machine()
    for arch in ARCHES.values():
        if machine == arch.machine:
            return arch
    raise RecipeError(f"this machine is {machine}; the recipe knows {', '.join(ARCHES)}")


def parse_arches(text: str) -> list[Arch]:
    """``amd64,arm64`` -> the Arch values; an unknown name is an error saying the known ones."""
    arches = []
    for name in (part.strip() for part in text.split(",") if part.strip()):
        if name not in ARCHES:
            raise RecipeError(f"--arch {name!r}: not one of {', '.join(ARCHES)}")
        arches.append(ARCHES[name])
    if not arches:
        raise RecipeError("--arch is empty: name at least one of " + ", ".join(ARCHES))
    return arches


def runtime_requirements() -> list[str]:
    """pyproject.toml's ``dependencies`` (the image installs no extra)."""
    import tomllib

    with (REPO / "pyproject.toml").open("rb") as handle:
        project = tomllib.load(handle)["project"]
    return list(project["dependencies"])


def _run(
    step: str,
    argv: Sequence[str],
    *,
    fix: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> None:
    result = subprocess.run(
        list(argv), cwd=cwd, env=env, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-25:])
        raise RecipeError(f"{step} failed (exit {result.returncode}): {argv[0]} ...\n{tail}\n{fix}")


# -- 1. the wheels --------------------------------------------------------------------------------


SOURCES = (
    "pyproject.toml", "constraints.txt", "README.md", "LICENSE", "CHANGELOG.md", "MANIFEST.in",
    "packaging", "src",
)  # fmt: skip
"""What gpushare's wheel is built from."""
GENERATED = ("__pycache__", "*.egg-info", "api_pb2*", "*.so", "gpushare-mountcheck", "build")
"""Build output in a checkout, which the wheel build makes again."""


def platform_tags(arch: Arch) -> list[str]:
    """The manylinux tags bookworm's python3 loads on ``arch``, for ``pip download``."""
    return [f"manylinux2014_{arch.machine}"] + [
        f"manylinux_2_{minor}_{arch.machine}" for minor in range(17, GLIBC_MINOR + 1)
    ]


def wheels(arch: Arch, out: Path, python: str) -> None:
    """gpushare's wheel and its runtime dependencies' wheels for ``arch`` into ``out``."""
    env = dict(os.environ)
    if arch != host_arch():
        env["CC"] = f"{arch.triplet}-gcc"
        if shutil.which(env["CC"]) is None:
            raise RecipeError(
                f"{env['CC']} not found: the interposer of the {arch.debian} image needs a "
                f"cross compiler (Debian/Ubuntu: apt-get install gcc-{arch.triplet})"
            )
    # from a copy: the backend writes the stubs and the interposer beside their sources, and a
    # foreign interposer left in the checkout would break this machine's tests
    source = out.parent / "source"
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns(*GENERATED))
        else:
            source.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    _run(
        "pip wheel (gpushare)",
        [python, "-m", "pip", "wheel", "-q", "--no-deps", "--wheel-dir", str(out), "."],
        cwd=source,
        env=env,
        fix="It needs PyPI (the build requirements) and gcc.",
    )
    tags = [arg for tag in platform_tags(arch) for arg in ("--platform", tag)]
    _run(
        "pip download (dependencies)",
        [
            python, "-m", "pip", "download", "-q", "--only-binary=:all:", *tags,
            "--python-version", PYTHON, "--implementation", "cp", "--abi", "cp311",
            "-c", "constraints.txt", "--dest", str(out), *runtime_requirements(),
        ],
        cwd=REPO,
        fix="It needs PyPI; every pinned dependency must have a wheel for " + arch.machine,
    )  # fmt: skip
    (own,) = out.glob(f"{WHEEL_NAME}-*.whl")
    with zipfile.ZipFile(own) as wheel:
        for native in NATIVE_FILES:
            if native not in wheel.namelist():
                raise RecipeError(f"{own.name} lacks {native}: the build backend must compile it")


# -- 2. the root filesystem -----------------------------------------------------------------------


def debian_mirror(snapshot: str) -> tuple[str, list[str]]:
    """The mirror and extra apt options for ``--snapshot`` (empty: deb.debian.org, unpinned).
    A snapshot's Release files are old by design, so apt must not refuse them as expired."""
    if not snapshot:
        return MIRROR, []
    if not SNAPSHOT_STAMP.fullmatch(snapshot):
        raise RecipeError(
            f"--snapshot {snapshot!r}: not a snapshot.debian.org timestamp; give "
            "YYYYMMDDTHHMMSSZ (UTC), e.g. 20261201T000000Z"
        )
    return SNAPSHOT_MIRROR.format(stamp=snapshot), ["--aptopt=Acquire::Check-Valid-Until false"]


def rootfs(
    arch: Arch, wheel_dir: Path, version: str, out: Path, python: str, snapshot: str = ""
) -> None:
    """A bookworm root filesystem tar at ``out`` with gpushare installed from ``wheel_dir``."""
    if shutil.which("mmdebstrap") is None:
        raise RecipeError(
            "mmdebstrap is not installed: it makes the Debian root filesystem. Install it "
            "(Debian/Ubuntu: apt-get install -y mmdebstrap) or run `make image-in-docker`."
        )
    mirror, aptopts = debian_mirror(snapshot)
    work = out.parent
    _run(
        "pip download pip",
        [python, "-m", "pip", "download", "-q", "--no-deps", "-d", str(work), "pip"],
        fix="It needs PyPI.",
    )
    # pip runs from its own wheel inside the root filesystem and is not installed there.
    (pip_wheel,) = work.glob("pip-*.whl")
    (work / "passwd").write_text(ACCOUNT)
    (work / "group").write_text(GROUP)
    hooks = [
        f'cp -r {wheel_dir} "$1/tmp/wheels"',
        f'cp {pip_wheel} "$1/tmp/"',
        f'chroot "$1" python3 /tmp/{pip_wheel.name}/pip install -q --no-index --no-cache-dir '
        f"--break-system-packages --no-warn-script-location --find-links /tmp/wheels "
        f"'{DISTRIBUTION}=={version}'",
        *(f'test -f "$1/{SITE_PACKAGES}/{native}"' for native in NATIVE_FILES),
        'test -x "$1/usr/local/bin/gpushare"',
        f'rm -rf "$1/tmp/wheels" "$1/tmp/{pip_wheel.name}"',
        f'cat {work / "passwd"} >> "$1/etc/passwd"',
        f'cat {work / "group"} >> "$1/etc/group"',
        'rm -rf "$1/var/lib/apt/lists"/* "$1/var/cache/apt"/*',
    ]
    argv = [
        "mmdebstrap",
        "--variant=minbase",
        "--mode=root" if os.geteuid() == 0 else "--mode=unshare",
        f"--architectures={arch.debian}",
        f"--include={','.join(DEB_PACKAGES)}",
        *(f"--dpkgopt=path-exclude={pattern}" for pattern in DPKG_EXCLUDES),
        "--aptopt=Acquire::Retries 3",
        *aptopts,
        *(f"--customize-hook={hook}" for hook in hooks),
        SUITE,
        str(out),
        mirror,
    ]
    foreign = (
        "" if arch == host_arch() else ", qemu-user-static registered in binfmt_misc, arch-test"
    )
    _run(
        "mmdebstrap",
        argv,
        fix=f"It needs root (or unprivileged user namespaces){foreign}, and {mirror}.",
    )


# -- 3. the OCI archive ---------------------------------------------------------------------------

INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


def _descriptor(media_type: str, data: bytes) -> dict[str, object]:
    return {
        "mediaType": media_type,
        "digest": "sha256:" + hashlib.sha256(data).hexdigest(),
        "size": len(data),
    }


def _compress(layer: Path, out: Path) -> tuple[str, str]:
    """gzip ``layer`` into ``out`` (no name or time in the header); (diff_id, digest)."""
    diff, packed = hashlib.sha256(), hashlib.sha256()
    with layer.open("rb") as source, out.open("wb") as raw:

        class Hashing:
            def write(self, data: bytes) -> int:
                packed.update(data)
                return raw.write(data)

            def flush(self) -> None:
                raw.flush()

        # level 6: 77 MiB in a fifth of the time level 9 (the default) takes for 76 MiB
        with gzip.GzipFile(
            filename="", mode="wb", fileobj=Hashing(), mtime=0, compresslevel=6
        ) as zipped:
            for block in iter(lambda: source.read(1 << 20), b""):
                diff.update(block)
                zipped.write(block)
    return "sha256:" + diff.hexdigest(), "sha256:" + packed.hexdigest()


def write_oci(out: Path, name: str, version: str, layers: dict[str, Path], created: str) -> None:
    """An OCI image layout tar at ``out``: one index naming ``name:version``, a manifest and
    config per architecture (``layers``: dpkg architecture -> root filesystem tar)."""
    blobs: dict[str, Path | bytes] = {}
    manifests = []
    with tempfile.TemporaryDirectory(prefix="gpushare-oci-") as tmp:
        for debian, layer in layers.items():
            packed = Path(tmp) / f"{debian}.tar.gz"
            diff_id, digest = _compress(layer, packed)
            image = config(version, ARCHES[debian], created)
            image["rootfs"] = {"type": "layers", "diff_ids": [diff_id]}
            image["history"] = [{"created": created, "created_by": "packaging/image.py"}]
            config_bytes = json.dumps(image, sort_keys=True).encode()
            layer_desc = {"mediaType": LAYER, "digest": digest, "size": packed.stat().st_size}
            manifest = {
                "schemaVersion": 2,
                "mediaType": MANIFEST,
                "config": _descriptor(CONFIG, config_bytes),
                "layers": [layer_desc],
            }
            manifest_bytes = json.dumps(manifest, sort_keys=True).encode()
            blobs[digest] = packed
            blobs[str(_descriptor(CONFIG, config_bytes)["digest"])] = config_bytes
            blobs[str(_descriptor(MANIFEST, manifest_bytes)["digest"])] = manifest_bytes
            manifests.append(
                {
                    **_descriptor(MANIFEST, manifest_bytes),
                    "platform": {"architecture": debian, "os": "linux"},
                }
            )
        index_bytes = json.dumps(
            {"schemaVersion": 2, "mediaType": INDEX, "manifests": manifests}, sort_keys=True
        ).encode()
        blobs[str(_descriptor(INDEX, index_bytes)["digest"])] = index_bytes
        top = {
            "schemaVersion": 2,
            "mediaType": INDEX,
            "manifests": [
                {
                    **_descriptor(INDEX, index_bytes),
                    "annotations": {
                        # containerd (ctr import) and docker load read the full name here;
                        # skopeo and the OCI spec read the tag from ref.name.
                        "io.containerd.image.name": f"{name}:{version}",
                        "org.opencontainers.image.ref.name": version,
                    },
                }
            ],
        }
        partial = out.with_name(out.name + ".partial")
        with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as tar:
            _add(tar, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
            _add(tar, "index.json", json.dumps(top, sort_keys=True).encode())
            for digest, blob in sorted(blobs.items()):
                arcname = "blobs/sha256/" + digest.removeprefix("sha256:")
                if isinstance(blob, Path):
                    info = tar.gettarinfo(str(blob), arcname)
                    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                    with blob.open("rb") as handle:
                        tar.addfile(info, handle)
                else:
                    _add(tar, arcname, blob)
        partial.replace(out)


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    import io

    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 0
    tar.addfile(info, io.BytesIO(data))


def created_time() -> str:
    """``SOURCE_DATE_EPOCH`` (reproducible builds set it), else the last commit's time."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if not epoch:
        found = subprocess.run(
            ["git", "log", "-1", "--format=%ct"], cwd=REPO, capture_output=True, text=True
        )
        epoch = found.stdout.strip() or "0"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(epoch)))


def build(
    out: Path,
    *,
    arches: Sequence[Arch],
    name: str,
    version: str,
    python: str,
    snapshot: str = "",
) -> Path:
    """The whole recipe: wheels, a root filesystem per architecture, the OCI archive."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpushare-image-") as tmp:
        layers = {}
        for arch in arches:
            work = Path(tmp) / arch.debian
            (work / "wheels").mkdir(parents=True)
            print(f"[image] {arch.debian}: wheels", flush=True)
            wheels(arch, work / "wheels", python)
            print(f"[image] {arch.debian}: root filesystem (mmdebstrap)", flush=True)
            rootfs(arch, work / "wheels", version, work / "rootfs.tar", python, snapshot)
            layers[arch.debian] = work / "rootfs.tar"
        print(f"[image] {out}: OCI archive", flush=True)
        write_oci(out, name, version, layers, created_time())
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the OCI archive to write")
    parser.add_argument("--arch", default="", help="amd64,arm64 (default: this machine's)")
    parser.add_argument("--name", default=REPOSITORY, help=f"repository (default {REPOSITORY})")
    parser.add_argument("--version", default="", help="tag (default: pyproject.toml's version)")
    parser.add_argument("--python", default=sys.executable, help="the Python that runs pip")
    parser.add_argument(
        "--snapshot",
        default=os.environ.get("DEBIAN_SNAPSHOT", ""),
        help="snapshot.debian.org timestamp YYYYMMDDTHHMMSSZ (default $DEBIAN_SNAPSHOT; "
        "empty: deb.debian.org)",
    )
    args = parser.parse_args(argv)
    try:
        arches = parse_arches(args.arch) if args.arch else [host_arch()]
        version = args.version or project_version()
        debian_mirror(args.snapshot)  # a bad timestamp stops before any download
        build(
            args.out,
            arches=arches,
            name=args.name,
            version=version,
            python=args.python,
            snapshot=args.snapshot,
        )
    except RecipeError as err:
        print(f"packaging/image.py: {err}", file=sys.stderr)
        return 1
    size = args.out.stat().st_size
    print(f"{args.name}:{version}\t{args.out}\t{size >> 20} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
