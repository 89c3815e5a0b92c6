"""`make release`'s artifacts: present, named for one version, and each usable on its own.

packaging/release.py runs here without the image (``--no-image``; the image's recipe is
tested by tests/unit/harness/test_image_archive.py and built by the real-node Helm test): the
wheel and sdist of ``kube-gpushare`` (the wheel built from the sdist), the packaged chart, the
kubectl plugin per architecture with its krew manifest, LICENSE, CHANGELOG and SHA256SUMS. It needs
PyPI (build requirements and the plugin's wheels) and helm; without ``build`` or helm it skips,
except under CI=true, where it fails.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import platform
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml

from harness.image_archive import project_version
from tests.support.chart import find_helm, pinned
from tests.support.releasetools import packaging_module, release_tools

REPO = Path(__file__).resolve().parents[3]


_packaging = packaging_module


CACHE = Path(os.environ.get("GPUSHARE_CACHE", Path.home() / ".cache" / "gpushare")) / "bin"
K8S_VERSION = pinned("K8S_VERSION")
VERSION = project_version()
CHART_VERSION = _packaging("release").semver(VERSION)
MACHINE = {"x86_64": "x86_64", "aarch64": "aarch64"}.get(platform.machine(), "")


def _missing() -> str:
    if importlib.util.find_spec("build") is None:
        return "python -m build is not installed (the test extra has it)"
    if find_helm() is None:
        return "helm is not built: run `make controlplane`"
    return ""


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    reason = _missing()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"release tools missing in CI: {reason}")
        pytest.skip(reason)
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "packaging/release.py", "--out", str(out), "--no-image"],
        cwd=REPO,
        env={**os.environ, "HELM": str(find_helm())},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_every_artifact_is_there_under_one_version(dist: Path) -> None:
    assert sorted(p.name for p in dist.iterdir()) == sorted(
        [
            "CHANGELOG.md",
            "LICENSE",
            "SHA256SUMS",
            f"gpushare-{CHART_VERSION}.tgz",
            "inspect-cgpu.yaml",
            f"kube_gpushare-{VERSION}-py3-none-manylinux_2_17_{MACHINE}.whl",
            f"kube_gpushare-{VERSION}.tar.gz",
            f"kubectl-inspect-cgpu_{VERSION}_linux_amd64.tar.gz",
            f"kubectl-inspect-cgpu_{VERSION}_linux_arm64.tar.gz",
            f"kubectl-inspect-cgpu_{VERSION}_darwin_amd64.tar.gz",
            f"kubectl-inspect-cgpu_{VERSION}_darwin_arm64.tar.gz",
            f"kubectl-inspect-cgpu_{VERSION}_windows_amd64.zip",
        ]
    )
    assert "Apache License" in (dist / "LICENSE").read_text()
    assert f"## {VERSION}" in (dist / "CHANGELOG.md").read_text()
    sums = dict(
        reversed(line.split("  ")) for line in (dist / "SHA256SUMS").read_text().splitlines()
    )
    assert set(sums) == {p.name for p in dist.iterdir()} - {"SHA256SUMS"}
    for name, digest in sums.items():
        assert hashlib.sha256((dist / name).read_bytes()).hexdigest() == digest, name


def test_the_distribution_is_ours_and_carries_the_interposer(dist: Path) -> None:
    """kube-gpushare, not gpushare (another project's name on PyPI); tagged for its machine,
    since the interposer in it is native code."""
    (wheel,) = dist.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(f"kube_gpushare-{VERSION}.dist-info/METADATA").decode()
        tags = archive.read(f"kube_gpushare-{VERSION}.dist-info/WHEEL").decode()
    assert "Name: kube-gpushare\n" in metadata and f"Version: {VERSION}\n" in metadata
    assert "License-Expression: Apache-2.0" in metadata
    assert f"kube_gpushare-{VERSION}.dist-info/licenses/LICENSE" in names
    assert f"Tag: py3-none-manylinux_2_17_{MACHINE}" in tags
    assert "gpushare/isolation/native/libgpushare-cuda.so" in names
    with tarfile.open(dist / f"kube_gpushare-{VERSION}.tar.gz") as sdist:
        members = {m.name.split("/", 1)[1] for m in sdist.getmembers() if "/" in m.name}
    # what the wheel is built again from, and nothing generated
    assert {"packaging/gpushare_build.py", "LICENSE", "CHANGELOG.md", "pyproject.toml"} <= members
    assert "src/gpushare/deviceplugin/kubelet/protos/v1beta1/api.proto" in members
    assert not [m for m in members if "api_pb2" in m or m.endswith(".so")]


def test_the_chart_is_packaged_at_the_version(dist: Path) -> None:
    with tarfile.open(dist / f"gpushare-{CHART_VERSION}.tgz") as chart:
        member = chart.extractfile("gpushare/Chart.yaml")
        assert member is not None
        meta = yaml.safe_load(member)
        values = chart.extractfile("gpushare/values.yaml")
        assert values is not None
        image = yaml.safe_load(values)["image"]
    assert (meta["version"], meta["appVersion"]) == (CHART_VERSION, VERSION)
    assert (image["registry"], image["repository"]) == ("ghcr.io", "gpushare/gpushare")


def _plugin_file(dist: Path, os_: str, arch: str, tmp_path: Path) -> Path:
    """The plugin's one file out of its release archive (tar.gz, or zip on Windows)."""
    if os_ == "windows":
        with zipfile.ZipFile(dist / f"kubectl-inspect-cgpu_{VERSION}_{os_}_{arch}.zip") as packed:
            data = packed.read("kubectl-inspect-cgpu.exe")
            assert sorted(packed.namelist()) == ["LICENSE", "kubectl-inspect-cgpu.exe"]
        name = "kubectl-inspect-cgpu.exe"
    else:
        with tarfile.open(dist / f"kubectl-inspect-cgpu_{VERSION}_{os_}_{arch}.tar.gz") as tar:
            assert sorted(tar.getnames()) == ["LICENSE", "kubectl-inspect-cgpu"]
            member = tar.extractfile("kubectl-inspect-cgpu")
            assert member is not None
            data = member.read()
        name = "kubectl-inspect-cgpu"
    target = tmp_path / f"{os_}-{arch}" / name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return target


PLATFORMS = [("linux", "amd64"), ("linux", "arm64"), ("darwin", "amd64"), ("darwin", "arm64"),
             ("windows", "amd64")]  # fmt: skip


def test_the_krew_manifest_names_each_plugin_archive(dist: Path) -> None:
    """One platform per laptop kubectl runs on; on Windows the bin is an .exe, because krew
    links it as kubectl-inspect_cgpu.exe (krew internal/installation/install.go,
    pluginNameToBin) and Windows runs only what is named .exe."""
    manifest = yaml.safe_load((dist / "inspect-cgpu.yaml").read_text())
    assert manifest["kind"] == "Plugin" and manifest["metadata"]["name"] == "inspect-cgpu"
    assert manifest["spec"]["version"] == f"v{CHART_VERSION}"
    seen = []
    for entry in manifest["spec"]["platforms"]:
        labels = entry["selector"]["matchLabels"]
        seen.append((labels["os"], labels["arch"]))
        ext = "zip" if labels["os"] == "windows" else "tar.gz"
        name = f"kubectl-inspect-cgpu_{VERSION}_{labels['os']}_{labels['arch']}.{ext}"
        assert entry["uri"].endswith(f"/v{VERSION}/{name}")
        assert entry["sha256"] == hashlib.sha256((dist / name).read_bytes()).hexdigest()
        want = "kubectl-inspect-cgpu.exe" if labels["os"] == "windows" else "kubectl-inspect-cgpu"
        assert entry["bin"] == want
        assert {"from": "LICENSE", "to": "."} in entry["files"]
    assert seen == PLATFORMS


def test_krew_validates_and_installs_the_plugin_on_every_platform(
    dist: Path, tmp_path: Path
) -> None:
    """krew's own code: validate-krew-manifest's rules, then ``kubectl krew install --manifest
    --archive`` for each (os, arch) (KREW_OS/KREW_ARCH, as validate-krew-manifest does it),
    which checks the sha256, unpacks and links the bin; the installed Linux one then runs as
    ``kubectl inspect-cgpu``."""
    tools = release_tools("krew", "validate-krew-manifest")
    krew, validator = tools["krew"], tools["validate-krew-manifest"]
    kubectl = CACHE / f"kubernetes-{K8S_VERSION}" / "kubectl"
    if not os.access(kubectl, os.X_OK):
        pytest.skip("kubectl is not built: make controlplane")
    checked = subprocess.run(
        [str(validator), "-manifest", str(dist / "inspect-cgpu.yaml"), "-skip-install"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stderr
    assert "no overlapping spec.platform[].selector" in checked.stderr
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kubectl-krew").symlink_to(krew)
    (bin_dir / "kubectl").symlink_to(kubectl)
    for os_, arch in PLATFORMS:
        root = tmp_path / f"krew-{os_}-{arch}"
        ext = "zip" if os_ == "windows" else "tar.gz"
        env = {
            "PATH": f"{bin_dir}:{os.environ['PATH']}", "KREW_ROOT": str(root),
            "KREW_OS": os_, "KREW_ARCH": arch, "HOME": str(tmp_path),
        }  # fmt: skip
        installed = subprocess.run(
            [str(kubectl), "krew", "install", f"--manifest={dist / 'inspect-cgpu.yaml'}",
             f"--archive={dist / f'kubectl-inspect-cgpu_{VERSION}_{os_}_{arch}.{ext}'}"],
            env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert installed.returncode == 0, installed.stderr
        link = "kubectl-inspect_cgpu" + (".exe" if os_ == "windows" else "")
        assert [p.name for p in (root / "bin").iterdir()] == [link]
    if MACHINE == "x86_64":
        env = {
            "PATH": f"{tmp_path / 'krew-linux-amd64' / 'bin'}:{bin_dir}:/usr/bin:/bin",
            "XDG_CACHE_HOME": str(tmp_path / "cache"), "HOME": str(tmp_path),
        }  # fmt: skip
        shown = subprocess.run(
            [str(kubectl), "inspect-cgpu", "--help"], env=env, capture_output=True, text=True
        )
        assert shown.returncode == 0, shown.stderr
        assert "Usage: kubectl-inspect_cgpu" in shown.stdout


@pytest.mark.parametrize(("os_", "arch"), [p for p in PLATFORMS if p[0] != "linux"])
def test_the_macos_and_windows_files_start_and_say_where_they_belong(
    dist: Path, tmp_path: Path, os_: str, arch: str
) -> None:
    """They cannot run here, but their zipapp does up to the platform check: this Python runs
    the file (on Windows, the launcher's appended zip) and is told which file to take. What is
    inside is each CPython's compiled dependencies for that platform."""
    plugin = _plugin_file(dist, os_, arch, tmp_path)
    env = {"PATH": os.environ["PATH"], "XDG_CACHE_HOME": str(tmp_path / "cache")}
    ran = subprocess.run(
        [sys.executable, "-I", str(plugin), "--help"], env=env, capture_output=True, text=True
    )
    assert ran.returncode == 1
    assert f"this file is for {os_}/{arch}, this Python runs on linux/" in ran.stderr
    with zipfile.ZipFile(plugin) as archive:
        names = archive.namelist()
    suffix = {"darwin": "-darwin.so", "windows": ".pyd"}[os_]
    for abi in ("cp311", "cp312", "cp313", "cp314"):
        compiled = [n for n in names if n.startswith(f"{abi}/") and n.endswith(suffix)]
        tops = {n.split("/")[1] for n in compiled}
        assert {"msgspec", "pydantic_core", "yaml"} <= tops, (abi, tops)
    assert not [n for n in names if n.startswith("cp3") and n.endswith(".so") and os_ == "windows"]


def test_the_windows_file_is_distlibs_launcher_with_a_python_shebang(
    dist: Path, tmp_path: Path
) -> None:
    """distlib's launcher (what pip puts before every Windows console script) finds its ``#!``
    line where the zip's end record says the archive starts (PC/launcher.c, find_shebang), and
    for ``#!/usr/bin/env python`` looks for python on PATH (USE_ENVIRONMENT). Read the same way
    here."""
    import struct

    data = _plugin_file(dist, "windows", "amd64", tmp_path).read_bytes()
    assert data[:2] == b"MZ"
    end = data.rfind(b"PK\x05\x06")
    cd_size, cd_offset = struct.unpack("<II", data[end + 12 : end + 20])
    start = end - cd_size - cd_offset
    shebang = b"#!/usr/bin/env python\r\n"
    assert data[start : start + len(shebang)] == shebang
    assert data[start + len(shebang) : start + len(shebang) + 4] == b"PK\x03\x04"  # the zip


def test_the_plugin_runs_alone(dist: Path, tmp_path: Path) -> None:
    """This machine's plugin file runs in a bare interpreter (-I, no site-packages of ours)
    and every module of gpushare.inspect and gpushare.kube imports from what it carries."""
    if not MACHINE:
        pytest.skip(f"no plugin built for {platform.machine()}")
    arch = {"x86_64": "amd64", "aarch64": "arm64"}[MACHINE]
    with tarfile.open(dist / f"kubectl-inspect-cgpu_{VERSION}_linux_{arch}.tar.gz") as tar:
        member = tar.extractfile("kubectl-inspect-cgpu")
        assert member is not None
        plugin = tmp_path / "kubectl-inspect-cgpu"
        plugin.write_bytes(member.read())
    env = {"PATH": os.environ["PATH"], "XDG_CACHE_HOME": str(tmp_path / "cache")}
    shown = subprocess.run(
        [sys.executable, "-I", str(plugin), "--help"], env=env, capture_output=True, text=True
    )
    assert shown.returncode == 0, shown.stderr
    assert "Usage: kubectl-inspect-cgpu" in shown.stdout
    (home,) = (tmp_path / "cache" / "kubectl-inspect-cgpu").iterdir()
    abi = "cp{}{}".format(*sys.version_info[:2])
    check = (
        f"import sys, pkgutil, importlib; sys.path[:0] = [{str(home / 'site')!r}, "
        f"{str(home / abi)!r}]\n"
        "import gpushare.inspect, gpushare.kube, rich.console, rich.table\n"
        "for pkg in (gpushare.inspect, gpushare.kube):\n"
        "    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
        "        importlib.import_module(m.name)\n"
        "assert gpushare.__file__.startswith(sys.path[0]), gpushare.__file__\n"
    )
    imported = subprocess.run(
        [sys.executable, "-I", "-c", check], env=env, capture_output=True, text=True
    )
    assert imported.returncode == 0, imported.stderr
    assert not list((home / "site" / "gpushare").rglob("*.so")), "the interposer stays out"


def test_a_chart_at_another_version_is_refused(tmp_path: Path) -> None:
    """pyproject.toml is the one version source: a chart left behind stops the release."""
    sys.path.insert(0, str(REPO / "packaging"))
    try:
        release = importlib.import_module("release")
        chart = tmp_path / "Chart.yaml"
        chart.write_text('version: 0.1.0\nappVersion: "0.1.0"\n')
        original = release.CHART
        release.CHART = tmp_path
        try:
            with pytest.raises(release.ReleaseError, match=r"version 0\.1\.0, appVersion 0\.1\.0"):
                release.check_versions("0.2.0")
            # a development version: SemVer for the chart, PEP 440 for the app (the image tag)
            chart.write_text('version: 0.2.0.dev0\nappVersion: "0.2.0.dev0"\n')
            with pytest.raises(release.ReleaseError, match=r"set version: 0\.2\.0-dev\.0 and"):
                release.check_versions("0.2.0.dev0")
        finally:
            release.CHART = original
        release.check_versions(VERSION)
    finally:
        sys.path.remove(str(REPO / "packaging"))


def test_the_wheel_tag_follows_the_interposers_glibc_needs(tmp_path: Path) -> None:
    """The backend reads what the library needs (readelf's version needs), not strings in it:
    the interposer names GLIBC_2.34 in a string and needs only 2.17."""
    sys.path.insert(0, str(REPO / "packaging"))
    try:
        backend = importlib.import_module("gpushare_build")
    finally:
        sys.path.remove(str(REPO / "packaging"))
    source = tmp_path / "lib.c"
    source.write_text('const char *name = "GLIBC_2.99";\nint answer(void) { return 42; }\n')
    library = tmp_path / "lib.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    assert backend.platform_tag(library) == f"manylinux_2_17_{MACHINE}"
    with pytest.raises(RuntimeError, match="not a little-endian ELF file"):
        backend.platform_tag(source)


@pytest.mark.parametrize(
    ("pep440", "chart"),
    [("0.1.0", "0.1.0"), ("0.2.0.dev0", "0.2.0-dev.0"), ("1.0.0rc2", "1.0.0-rc.2"),
     ("1.0.0b1.dev3", "1.0.0-beta.1.dev.3")],
)  # fmt: skip
def test_the_chart_version_is_the_project_version_in_semver(pep440: str, chart: str) -> None:
    """Helm refuses ``0.2.0.dev0`` as a chart version (not SemVer): the release spells it
    ``0.2.0-dev.0``; a version with no SemVer spelling is refused, naming the forms."""
    release = _packaging("release")
    assert release.semver(pep440) == chart
    with pytest.raises(release.ReleaseError, match=r"'0\.2' is not X\.Y\.Z"):
        release.semver("0.2")


def test_the_package_says_the_project_version() -> None:
    """``gpushare --version`` (and the exported snapshots) say pyproject.toml's version."""
    import gpushare

    assert gpushare.__version__ == VERSION
