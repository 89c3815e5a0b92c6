"""A release: every artifact, versioned from pyproject.toml alone.

    python packaging/release.py --out dist/0.1.0 --image dist/0.1.0/gpushare-image-0.1.0.oci.tar
    make release                                   # the same, building the image first

Into ``--out`` (the names are what ``tests/integration/packaging/test_release.py`` checks):

- ``gpushare-image-<v>.oci.tar``: the image from ``packaging/image.py`` (``make image``), named
  ``ghcr.io/gpushare/gpushare:<v>``; push with ``skopeo copy --all oci-archive:...``;
- ``gpushare-<semver(v)>.tgz``: the chart (``helm package``; ``0.2.0.dev0`` is ``0.2.0-dev.0``
  there); push with ``helm push ...
  oci://ghcr.io/gpushare/charts``;
- ``kube_gpushare-<v>.tar.gz`` and ``kube_gpushare-<v>-py3-none-manylinux_2_17_<m>.whl``: the
  ``kube-gpushare`` distribution (``gpushare`` on PyPI is another project's; the import name
  is still ``gpushare``), built by ``python -m build``, the wheel from the sdist;
- ``kubectl-inspect-cgpu_<v>_<os>_<arch>.tar.gz`` (``.zip`` on Windows): the kubectl plugin
  alone, one file (a zipapp carrying its dependencies, which it unpacks once into the user's
  cache folder; any CPython in ``PLUGIN_PYTHONS`` runs it; on Windows behind distlib's ``.exe``
  launcher) and LICENSE, for each of ``PLUGIN_PLATFORMS``: Linux and macOS on amd64 and arm64,
  Windows on amd64; ``inspect-cgpu.yaml``, the krew manifest pointing at them
  (``kubectl krew install --manifest=inspect-cgpu.yaml``);
- ``LICENSE``, ``CHANGELOG.md`` and ``SHA256SUMS``.

Nothing here pushes: publishing needs credentials, which a build does not hold.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import image

REPO = image.REPO
CHART = REPO / "charts" / "gpushare"
RELEASES = "https://github.com/gpushare/gpushare/releases/download"
"""Where a release's files are published (krew downloads the plugin from there)."""
PLUGIN = "kubectl-inspect-cgpu"
PLUGIN_ENTRY = "gpushare.inspect.cli:main"
PLUGIN_REQUIREMENTS = (
    "click", "rich", "msgspec", "pydantic", "lightkube", "lightkube-models", "PyYAML",
)  # fmt: skip
"""What ``gpushare.inspect`` imports (with what those need, which pip resolves); pinned by
pyproject.toml's dependencies. tests/integration/packaging/test_release.py imports every module of
gpushare.inspect and gpushare.kube from the plugin to show nothing is missing."""
PLUGIN_PYTHONS = ("3.11", "3.12", "3.13", "3.14")
"""The CPython versions the plugin carries compiled dependencies for. 3.11 is the floor of the
code itself (gpushare.kube uses ``except*`` and ``asyncio.TaskGroup``)."""
MACOS_MIN = 12
"""The oldest macOS whose wheels the plugin takes (pip's macosx_* tags up to this one)."""


@dataclass(frozen=True)
class PluginPlatform:
    """One (os, arch) of krew's, and what the plugin's file for it is made of."""

    os: str
    """krew's ``os`` (Go's GOOS): linux, darwin, windows."""
    arch: str
    """krew's ``arch`` (GOARCH): amd64, arm64."""
    sys_platform: str
    """Python's ``sys.platform`` there."""
    machines: tuple[str, ...]
    """What Python's ``platform.machine()`` says there."""
    wheel_tags: tuple[str, ...]
    """pip's ``--platform`` tags whose wheels load there."""

    @property
    def windows(self) -> bool:
        return self.os == "windows"

    @property
    def bin(self) -> str:
        """krew links ``kubectl-inspect_cgpu`` (``.exe`` on Windows) to this file, and Windows
        runs only an ``.exe`` so named (krew's installation.pluginNameToBin)."""
        return PLUGIN + (".exe" if self.windows else "")

    def archive(self, version: str) -> str:
        return f"{PLUGIN}_{version}_{self.os}_{self.arch}.{'zip' if self.windows else 'tar.gz'}"


def _macos_tags(machine: str) -> tuple[str, ...]:
    releases = [f"10_{minor}" for minor in range(9, 16)] + [
        f"{major}_0" for major in range(11, MACOS_MIN + 1)
    ]
    if machine == "arm64":
        releases = [r for r in releases if not r.startswith("10_")]
    return tuple(f"macosx_{r}_{m}" for r in releases for m in (machine, "universal2"))


PLUGIN_PLATFORMS = (
    PluginPlatform("linux", "amd64", "linux", ("x86_64",),
                   tuple(image.platform_tags(image.ARCHES["amd64"]))),
    PluginPlatform("linux", "arm64", "linux", ("aarch64",),
                   tuple(image.platform_tags(image.ARCHES["arm64"]))),
    PluginPlatform("darwin", "amd64", "darwin", ("x86_64",), _macos_tags("x86_64")),
    PluginPlatform("darwin", "arm64", "darwin", ("arm64",), _macos_tags("arm64")),
    PluginPlatform("windows", "amd64", "win32", ("AMD64",), ("win_amd64",)),
)  # fmt: skip
"""Where ``kubectl inspect cgpu`` runs: the laptops people run kubectl from."""
WINDOWS_LAUNCHER = "t64.exe"
"""distlib's console launcher (in pip, pip/_vendor/distlib): the ``.exe`` pip puts in front of
every console script on Windows. It reads the ``#!`` line before the zip appended to it, finds
``python`` on PATH for ``#!/usr/bin/env python``, and runs the file itself as a zipapp."""


class ReleaseError(RuntimeError):
    """A release step failed or its inputs disagree; the message says what to do."""


def _run(step: str, argv: Sequence[str], *, cwd: Path = REPO) -> str:
    done = subprocess.run(list(argv), cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-25:])
        raise ReleaseError(f"{step} failed (exit {done.returncode}): {' '.join(argv[:4])}\n{tail}")
    return done.stdout


def chart_versions() -> tuple[str, str]:
    """Chart.yaml's (version, appVersion)."""
    text = (CHART / "Chart.yaml").read_text()
    found = [
        re.search(rf"^{key}:\s*\"?([^\"\s]+)\"?\s*$", text, re.M)
        for key in ("version", "appVersion")
    ]
    if not all(found):
        raise ReleaseError(f"{CHART / 'Chart.yaml'} lacks version or appVersion")
    return found[0].group(1), found[1].group(1)  # type: ignore[union-attr]


PRE_RELEASES = {"a": "alpha", "b": "beta", "rc": "rc"}
PEP440 = re.compile(
    r"(?P<release>\d+\.\d+\.\d+)(?:(?P<pre>a|b|rc)(?P<n>\d+))?(?:\.dev(?P<dev>\d+))?"
)


def semver(version: str) -> str:
    """pyproject.toml's version (PEP 440) as SemVer 2, which Helm's chart version and krew's
    plugin version must be: ``0.2.0`` stays, ``0.2.0.dev0`` is ``0.2.0-dev.0``, ``0.2.0rc1`` is
    ``0.2.0-rc.1``. The image tag and the chart's appVersion keep the PEP 440 spelling (a tag
    may hold it; the wheel's name carries it)."""
    found = PEP440.fullmatch(version)
    if found is None:
        raise ReleaseError(
            f"pyproject.toml version {version!r} is not X.Y.Z, X.Y.Z{{a,b,rc}}N or X.Y.Z.devN: "
            "the chart needs a SemVer version made from it; use one of those forms"
        )
    parts = []
    if found["pre"]:
        parts += [PRE_RELEASES[found["pre"]], found["n"]]
    if found["dev"]:
        parts += ["dev", found["dev"]]
    return found["release"] + ("-" + ".".join(parts) if parts else "")


def check_versions(version: str) -> None:
    """The chart must carry pyproject.toml's version: as appVersion, and as its version in
    SemVer spelling (``semver``)."""
    chart, app = chart_versions()
    want = semver(version)
    if (chart, app) != (want, version):
        raise ReleaseError(
            f"charts/gpushare/Chart.yaml has version {chart}, appVersion {app}; pyproject.toml "
            f'says {version}: set version: {want} and appVersion: "{version}" '
            "(pyproject.toml is the version source)"
        )
    listed = re.findall(
        rf"image: {re.escape(image.REPOSITORY)}:(\S+)", (CHART / "Chart.yaml").read_text()
    )
    if listed != [version]:
        raise ReleaseError(
            f"charts/gpushare/Chart.yaml's artifacthub.io/images names {image.REPOSITORY} at "
            f"{listed or 'no version'}; set it to {image.REPOSITORY}:{version} (Artifact Hub scans "
            "that image)"
        )


def find_helm() -> str:
    """$HELM, else helm on PATH, else the one harness/controlplane/build.sh caches."""
    cache = Path(os.environ.get("GPUSHARE_CACHE", Path.home() / ".cache" / "gpushare"))
    candidates = [os.environ.get("HELM", ""), shutil.which("helm") or ""]
    candidates += [str(p) for p in sorted((cache / "bin").glob("helm-*/helm"), reverse=True)]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise ReleaseError("no helm: put helm 3 on PATH, set HELM, or run `make controlplane`")


# -- the distribution -----------------------------------------------------------------------------


def distribution(out: Path, python: str) -> list[Path]:
    """The sdist, and the wheel built from it (``python -m build``)."""
    _run("python -m build", [python, "-m", "build", "--outdir", str(out), "."])
    built = sorted(out.glob(f"{image.WHEEL_NAME}-*"))
    if len(built) != 2:
        raise ReleaseError(f"python -m build made {[p.name for p in built]}, not a wheel and sdist")
    return built


# -- the kubectl plugin ---------------------------------------------------------------------------

BOOTSTRAP = """\
\"\"\"kubectl-inspect-cgpu {version} ({os}/{arch}): unpacks its libraries once, then runs.\"\"\"
import os, platform, sys, tempfile, zipfile, shutil

BUILD, SYS_PLATFORM, MACHINES, PYTHONS = {build!r}, {sys_platform!r}, {machines!r}, {pythons!r}


def main():
    abi = "cp%d%d" % sys.version_info[:2]
    if sys.implementation.name != "cpython" or abi not in PYTHONS:
        sys.exit("kubectl-inspect-cgpu needs CPython %s; this is %s %s (%s)" % (
            ", ".join(p[2] + "." + p[3:] for p in PYTHONS), sys.implementation.name,
            platform.python_version(), sys.executable))
    if sys.platform != SYS_PLATFORM or platform.machine() not in MACHINES:
        sys.exit("kubectl-inspect-cgpu: this file is for {os}/{arch}, this Python runs on %s/%s; "
                 "take the release file for it" % (sys.platform, platform.machine()))
    if sys.platform == "win32":
        cache = os.environ.get("LOCALAPPDATA") or os.path.expanduser("~")
    else:
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    home = os.path.join(cache, "kubectl-inspect-cgpu", BUILD)
    if not os.path.exists(os.path.join(home, "complete")):
        os.makedirs(os.path.dirname(home), exist_ok=True)
        work = tempfile.mkdtemp(dir=os.path.dirname(home))
        with zipfile.ZipFile(os.path.dirname(os.path.abspath(__file__))) as archive:
            archive.extractall(work, [n for n in archive.namelist() if n != "__main__.py"])
        open(os.path.join(work, "complete"), "w").close()
        try:
            os.rename(work, home)
        except OSError:  # another run unpacked it first
            shutil.rmtree(work, ignore_errors=True)
    sys.path[:0] = [os.path.join(home, "site"), os.path.join(home, abi)]
    from {module} import {function}
    sys.exit({function}())


main()
"""


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    tar.addfile(info, io.BytesIO(data))


def windows_launcher() -> bytes:
    """distlib's console launcher, from the pip this build runs (pinned by the Makefile)."""
    from pip._vendor import distlib

    return (Path(distlib.__file__).parent / WINDOWS_LAUNCHER).read_bytes()


def plugin(wheel: Path, target: PluginPlatform, version: str, work: Path, python: str) -> bytes:
    """The plugin for ``target`` as one executable file: a zipapp of gpushare's wheel and the
    plugin's requirements unpacked, compiled ones per CPython in PLUGIN_PYTHONS, behind a
    ``#!`` line (Linux, macOS) or distlib's launcher and a ``#!`` line (Windows)."""
    pins = {re.split(r"[=<>]", r)[0].lower(): r for r in image.runtime_requirements()}
    requirements = [pins[name.lower()] for name in PLUGIN_REQUIREMENTS]
    tags = [arg for tag in target.wheel_tags for arg in ("--platform", tag)]
    layout: dict[str, Path] = {}
    for version_ in PLUGIN_PYTHONS:
        abi = "cp" + version_.replace(".", "")
        folder = work / f"{target.os}-{target.arch}" / abi
        _run(
            f"pip download (plugin, {target.os}/{target.arch}, Python {version_})",
            [
                python, "-m", "pip", "download", "-q", "--only-binary=:all:", *tags,
                "--python-version", version_, "--implementation", "cp", "--abi", abi,
                "-c", "constraints.txt", "--dest", str(folder), *requirements,
            ],
        )  # fmt: skip
        for found in sorted(folder.glob("*.whl")):
            pure = found.name.endswith("-none-any.whl")
            layout[f"site/{found.name}" if pure else f"{abi}/{found.name}"] = found
    layout[f"site/{wheel.name}"] = wheel
    shebang = b"#!/usr/bin/env python\r\n" if target.windows else b"#!/usr/bin/env python3\n"
    buffer = io.BytesIO()
    buffer.write(shebang)
    digest = hashlib.sha256(f"{version} {target.os} {target.arch}".encode())
    with zipfile.ZipFile(buffer, "a", zipfile.ZIP_DEFLATED) as archive:
        for where, path in sorted(layout.items()):
            folder_name = where.split("/", 1)[0]
            digest.update(where.encode())
            with zipfile.ZipFile(path) as whl:
                for member in whl.infolist():
                    top = member.filename.split("/", 1)[0]
                    # scripts and headers (*.data) have no use here, nor the interposer
                    interposer = top == "gpushare" and member.filename.endswith(".so")
                    if member.is_dir() or top.endswith(".data") or interposer:
                        continue
                    info = zipfile.ZipInfo(
                        f"{folder_name}/{member.filename}", (1980, 1, 1, 0, 0, 0)
                    )
                    info.compress_type = zipfile.ZIP_DEFLATED
                    info.external_attr = member.external_attr
                    archive.writestr(info, whl.read(member))
        module, function = PLUGIN_ENTRY.split(":")
        main = BOOTSTRAP.format(
            version=version,
            os=target.os,
            arch=target.arch,
            build=digest.hexdigest()[:16],
            sys_platform=target.sys_platform,
            machines=target.machines,
            pythons=tuple("cp" + v.replace(".", "") for v in PLUGIN_PYTHONS),
            module=module,
            function=function,
        )
        info = zipfile.ZipInfo("__main__.py", (1980, 1, 1, 0, 0, 0))
        archive.writestr(info, main)
    # the launcher goes in front of the #! line: the zip's offsets count from that line, which
    # the launcher and Python's zipimport both find
    return (windows_launcher() if target.windows else b"") + buffer.getvalue()


def krew_manifest(version: str, archives: dict[PluginPlatform, tuple[str, str]]) -> str:
    """The krew plugin manifest: one platform per (PluginPlatform -> (file name, sha256)).
    krew names the installed link ``kubectl-inspect_cgpu``, so the command it gives is
    ``kubectl inspect-cgpu``; ``pip``/``pipx`` install ``kubectl-inspect-cgpu``, which kubectl
    runs as ``kubectl inspect cgpu``."""
    platforms = "".join(
        f"""  - selector:
      matchLabels:
        os: {target.os}
        arch: {target.arch}
    uri: {RELEASES}/v{version}/{name}
    sha256: {sha}
    bin: {target.bin}
    files:
    - from: {target.bin}
      to: .
    - from: LICENSE
      to: .
"""
        for target, (name, sha) in archives.items()
    )
    pythons = ", ".join(PLUGIN_PYTHONS)
    return f"""apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: inspect-cgpu
spec:
  version: v{semver(version)}
  homepage: https://github.com/gpushare/gpushare
  shortDescription: Show shared GPU memory and compute per node, GPU and pod
  description: |
    kubectl inspect-cgpu shows how gpushare (ACK's aliyun.com/gpu-mem contract) has shared each
    node's GPUs among pods, and --explain POD says why a GPU pod is Pending.
  caveats: |
    Needs CPython {pythons} on PATH: as python3 on Linux and macOS ({MACOS_MIN} or newer), as
    python on Windows (python.org's installer with "Add python.exe to PATH").
    The first run unpacks its libraries into your cache folder.
  platforms:
{platforms}"""


def plugins(wheel_python: str, version: str, out: Path, work: Path) -> list[Path]:
    """The plugin's archive per PLUGIN_PLATFORMS and the krew manifest."""
    archives: dict[PluginPlatform, tuple[str, str]] = {}
    made = []
    # gpushare's own wheel is the same Python code for every machine but its interposer, which
    # the plugin leaves out
    (wheel,) = out.glob(f"{image.WHEEL_NAME}-{version}-*.whl")
    for target in PLUGIN_PLATFORMS:
        executable = plugin(wheel, target, version, work, wheel_python)
        archive = out / target.archive(version)
        licence = (REPO / "LICENSE").read_bytes()
        if target.windows:
            raw = io.BytesIO()
            with zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as packed:
                for name, data, mode in (
                    (target.bin, executable, 0o755),
                    ("LICENSE", licence, 0o644),
                ):
                    info = zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0))
                    info.compress_type = zipfile.ZIP_DEFLATED
                    info.external_attr = mode << 16
                    packed.writestr(info, data)
            archive.write_bytes(raw.getvalue())
        else:
            raw = io.BytesIO()
            with tarfile.open(fileobj=raw, mode="w") as tar:
                _add(tar, target.bin, executable, 0o755)
                _add(tar, "LICENSE", licence)
            archive.write_bytes(_gzip(raw.getvalue()))
        archives[target] = (archive.name, hashlib.sha256(archive.read_bytes()).hexdigest())
        made.append(archive)
    manifest = out / "inspect-cgpu.yaml"
    manifest.write_text(krew_manifest(version, archives))
    return [*made, manifest]


def _gzip(data: bytes) -> bytes:
    import gzip

    return gzip.compress(data, mtime=0)


# -- the whole release ----------------------------------------------------------------------------


def release(out: Path, *, image_archive: Path | None, python: str) -> list[Path]:
    """Every artifact into ``out``; returns them (SHA256SUMS last)."""
    version = image.project_version()
    check_versions(version)
    out.mkdir(parents=True, exist_ok=True)
    made: list[Path] = []
    if image_archive is not None:
        made.append(image_into(image_archive, out, version))
    made += distribution(out, python)
    _run("helm package", [find_helm(), "package", str(CHART), "--destination", str(out)])
    made.append(out / f"gpushare-{semver(version)}.tgz")
    with tempfile.TemporaryDirectory(prefix="gpushare-release-") as tmp:
        made += plugins(python, version, out, Path(tmp))
    for name in ("LICENSE", "CHANGELOG.md"):
        shutil.copyfile(REPO / name, out / name)
        made.append(out / name)
    sums = out / "SHA256SUMS"
    sums.write_text(
        "".join(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}\n" for p in made)
    )
    return [*made, sums]


def image_into(archive: Path, out: Path, version: str) -> Path:
    """The recipe's archive, checked to name this version, under its release name."""
    import json

    if not archive.is_file():
        raise ReleaseError(f"--image {archive}: no such file; build it with `make image`")
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        if member is None:
            raise ReleaseError(f"--image {archive}: no index.json; not the recipe's OCI archive")
        index = json.load(member)
    names = {m.get("annotations", {}).get("io.containerd.image.name") for m in index["manifests"]}
    wanted = f"{image.REPOSITORY}:{version}"
    if names != {wanted}:
        raise ReleaseError(f"--image {archive} names {names}, not {wanted}: run `make image`")
    target = out / f"gpushare-image-{version}.oci.tar"
    if archive.resolve() != target.resolve():
        shutil.copyfile(archive, target)
    return target


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="where the artifacts go")
    parser.add_argument("--image", type=Path, help="the OCI archive of `make image`")
    parser.add_argument("--no-image", action="store_true", help="leave the image out")
    parser.add_argument("--python", default=sys.executable, help="runs pip and build")
    args = parser.parse_args(argv)
    if args.image is None and not args.no_image:
        parser.error("give --image ARCHIVE (from `make image`) or --no-image")
    try:
        made = release(
            args.out, image_archive=None if args.no_image else args.image, python=args.python
        )
    except (ReleaseError, image.RecipeError) as err:
        print(f"packaging/release.py: {err}", file=sys.stderr)
        return 1
    for path in made:
        print(f"{path.stat().st_size:>12}  {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
