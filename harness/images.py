"""Local container images for the real node, built from Debian packages (no registry needed).

Nothing can be pulled on these machines, so the real node imports two one-layer docker-archive
images that containerd's ``ctr images import`` reads (``manifest.json``, a config JSON, one
``layer.tar``):

- ``gpushare.local/pause:1``: the pod sandbox image; ``sleep`` forever.
- ``gpushare.local/node-test:1``: busybox (static, from ``busybox-static``) for ``sh``/``env``,
  plus ``/probe``, a dynamically linked program with the loader and the glibc libraries it and
  the interposer need, so a test can see ``LD_PRELOAD`` take effect under the real runtime; and
  ``/memops`` and ``/launches`` with the CPU-only fake driver and NVML of
  ``harness/fakegpu/fakes`` installed as ``libcuda.so.1`` and ``libnvidia-ml.so.1`` where the
  NVIDIA runtime would mount the real ones, so the interposer's limits and cGPU schedules can be
  exercised inside a real container; and ``/flood``, a hostile process that opens many
  connections to the accounting broker's socket (``node/flood.c``); and, as a hostile image
  would have them, links from ``/x/y/z/`` to each isolation path and to ``/etc``
  (:data:`HOSTILE_LINKS`), so that a volume at the link lands over what the plugin mounted;
  ``/var/run`` links to ``/run``, as in Debian's images.

Both come from the same layer. They are rebuilt when their inputs change (a content hash).
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROBE_SOURCE = HERE / "node" / "probe.c"
FLOOD_SOURCE = HERE / "node" / "flood.c"
FAKEGPU = HERE / "fakegpu"
NATIVE = HERE.parent / "src" / "gpushare" / "isolation" / "native"
LIBDIR = "usr/lib/x86_64-linux-gnu"
PAUSE_IMAGE = "gpushare.local/pause:1"
TEST_IMAGE = "gpushare.local/node-test:1"
BUSYBOX = Path("/bin/busybox")
# The loader and the libraries /probe and the interposer (libgpushare-cuda.so) link against.
GLIBC = (
    Path("/lib64/ld-linux-x86-64.so.2"),
    Path("/lib/x86_64-linux-gnu/libc.so.6"),
    Path("/lib/x86_64-linux-gnu/libdl.so.2"),
    Path("/lib/x86_64-linux-gnu/libpthread.so.0"),
)


def _add_file(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    tar.addfile(info, io.BytesIO(data))


def _add_dir(tar: tarfile.TarFile, name: str, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, 0
    tar.addfile(info)


def _add_link(tar: tarfile.TarFile, name: str, target: str) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mtime, info.mode = tarfile.SYMTYPE, target, 0, 0o777
    tar.addfile(info)


def _build_driver(out: Path) -> dict[str, Path]:
    """The fake driver and NVML under their real sonames, and the programs linked against them."""
    cc = ["gcc", "-O2", "-fPIC", f"-I{NATIVE}"]
    cuda, nvml = out / "libcuda.so.1", out / "libnvidia-ml.so.1"
    for lib, source, libs in (
        (cuda, "fake_cuda.c", ["-lpthread"]),
        (nvml, "fake_nvml.c", ["-ldl"]),
    ):
        soname = f"-Wl,-soname,{lib.name}"
        source_path = str(FAKEGPU / "fakes" / source)
        subprocess.run(
            [*cc, "-shared", soname, "-o", str(lib), source_path, *libs],
            check=True,
            capture_output=True,
        )
    linked = ["-l:libcuda.so.1", "-l:libnvidia-ml.so.1", "-ldl"]
    programs = {}
    for name in ("memops", "launches"):
        program = str(FAKEGPU / "programs" / f"{name}.c")
        subprocess.run(
            [*cc, "-o", str(out / name), program, f"-L{out}", *linked],
            check=True,
            capture_output=True,
        )
        programs[name] = out / name
    return {f"{LIBDIR}/{cuda.name}": cuda, f"{LIBDIR}/{nvml.name}": nvml, **programs}


HOSTILE_LINKS = {
    "x/y/z/sched": "/var/run/gpushare-sched",
    "x/y/z/conf": "/etc/gpushare",
    "x/y/z/etc": "/etc",
    "x/y/z/lib": "/usr/local/gpushare",
    "x/y/z/broker": "/var/run/gpushare",
}
"""Links a tenant's image may hold: ``/x/y/z/<name>`` to an isolation path (or above one)."""


def _layer(probe: Path, flood: Path, driver: dict[str, Path]) -> bytes:
    applets = subprocess.run(
        [str(BUSYBOX), "--list"], check=True, capture_output=True, text=True
    ).stdout.split()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        directories = ("bin", "etc", "tmp", "lib", "lib64", "lib/x86_64-linux-gnu", "usr", "run")
        for directory in (*directories, "var", "x", "x/y", "x/y/z"):
            _add_dir(tar, directory, 0o1777 if directory == "tmp" else 0o755)
        _add_link(tar, "var/run", "/run")
        for link, target in HOSTILE_LINKS.items():
            _add_link(tar, link, target)
        _add_file(tar, "bin/busybox", BUSYBOX.read_bytes())
        for applet in sorted(set(applets) - {"busybox"}):
            _add_link(tar, f"bin/{applet}", "busybox")
        for library in GLIBC:
            _add_file(tar, str(library).lstrip("/"), library.resolve().read_bytes())
        _add_file(tar, "probe", probe.read_bytes())
        _add_file(tar, "flood", flood.read_bytes())
        for directory in ("usr/lib", LIBDIR):
            _add_dir(tar, directory)
        for name, path in sorted(driver.items()):
            _add_file(tar, name, path.read_bytes())
        _add_file(tar, "etc/passwd", b"root:x:0:0:root:/:/bin/sh\n", 0o644)
        _add_file(tar, "etc/group", b"root:x:0:\n", 0o644)
    return buffer.getvalue()


def _archive(path: Path, tag: str, layer: bytes, cmd: list[str]) -> None:
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": ["PATH=/bin"], "Cmd": cmd},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "gpushare harness/images.py"}],
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    manifest = [{"Config": config_name, "RepoTags": [tag], "Layers": ["layer.tar"]}]
    tmp = path.with_suffix(".tmp")
    with tarfile.open(tmp, "w") as tar:
        _add_file(tar, "layer.tar", layer, 0o644)
        _add_file(tar, config_name, config_bytes, 0o644)
        _add_file(tar, "manifest.json", json.dumps(manifest).encode(), 0o644)
    tmp.replace(path)


def build_images(out: Path) -> dict[str, Path]:
    """Build (or reuse) both archives under ``out``; map each image name to its archive."""
    out.mkdir(parents=True, exist_ok=True)
    probe = out / "probe"
    flood = out / "flood"
    for program, source in ((probe, PROBE_SOURCE), (flood, FLOOD_SOURCE)):
        subprocess.run(
            ["gcc", "-O2", "-o", str(program), str(source)], check=True, capture_output=True
        )
    driver = _build_driver(out)
    inputs = hashlib.sha256()
    for part in (BUSYBOX, probe, flood, *GLIBC, *sorted(driver.values()), Path(__file__)):
        inputs.update(part.resolve().read_bytes())
    stamp = out / "inputs.sha256"
    archives = {PAUSE_IMAGE: out / "pause.tar", TEST_IMAGE: out / "node-test.tar"}
    fresh = stamp.exists() and stamp.read_text() == inputs.hexdigest()
    if fresh and all(p.exists() for p in archives.values()):
        return archives
    layer = _layer(probe, flood, driver)
    _archive(archives[PAUSE_IMAGE], PAUSE_IMAGE, layer, ["/bin/sleep", "2147483647"])
    _archive(archives[TEST_IMAGE], TEST_IMAGE, layer, ["/bin/sh"])
    stamp.write_text(inputs.hexdigest())
    return archives
