"""Build the native interposer: ``python -m gpushare.isolation.build``.

The interposer is plain C (``native/interposer.c`` and its own ``native/gpushare_cuda.h``, which
declares the few CUDA driver and NVML types it needs), so building it needs only a C compiler,
the C library, libdl and libpthread: no CUDA toolkit. The library lands next to its
sources, ``native/libgpushare-cuda.so``, where the package data and the device plugin find it.
Beside it, ``native/gpushare-mountcheck``: the runtime hook that refuses a container whose
isolation mounts something in the pod moved (``native/mountcheck.c``), linked statically because
it runs on the host, whatever C library the host has (Bottlerocket's, say).
Warnings are errors, so a compiler upgrade that notices something fails the build loudly.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

NATIVE = Path(__file__).parent / "native"
LIB_NAME = "libgpushare-cuda.so"
"""The interposer's file name: built here, installed and preloaded by the device plugin."""
SOURCES = ("interposer.c",)
MOUNTCHECK_NAME = "gpushare-mountcheck"
"""The runtime hook's file name: built here, installed on the host by the device plugin."""
MOUNTCHECK_SOURCES = ("mountcheck.c",)
CFLAGS = ("-O2", "-fPIC", "-Wall", "-Wextra", "-Werror", "-std=gnu11")
LIBS = ("-ldl", "-lpthread")
# The interposer needs libdl.so.2 and libpthread.so.0 on glibc < 2.34, where dlopen and
# pthread_create still live there (interposer.c binds to their old symbol versions).
INTERPOSER_LIBS = ("-Wl,--no-as-needed", "-l:libdl.so.2", "-l:libpthread.so.0")


class BuildError(Exception):
    """The interposer (or a test double) could not be compiled."""


def compiler(cc: str = "gcc") -> str:
    """Path of the C compiler, or BuildError saying how to get one."""
    path = shutil.which(cc)
    if path is None:
        raise BuildError(
            f"C compiler {cc!r} not found on PATH: install gcc (Debian/Ubuntu: apt-get install "
            "gcc; the image's build stage has it) to build the gpushare interposer"
        )
    return path


def compile_shared(
    sources: Sequence[Path],
    out: Path,
    *,
    cc: str = "gcc",
    extra: Sequence[str] = (),
    libs: Sequence[str] = LIBS,
) -> Path:
    """Compile C sources into the shared library out, with the headers of NATIVE in reach."""
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        compiler(cc),
        *CFLAGS,
        "-shared",
        f"-I{NATIVE}",
        *extra,
        "-o",
        str(out),
        *(str(s) for s in sources),
        *libs,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BuildError(f"{' '.join(cmd)} failed (exit {done.returncode}):\n{done.stderr}")
    return out


def compile_program(sources: Sequence[Path], out: Path, *, cc: str = "gcc") -> Path:
    """Compile C sources into the static program out."""
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [compiler(cc), *CFLAGS, "-static", "-o", str(out), *(str(s) for s in sources)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BuildError(
            f"{' '.join(cmd)} failed (exit {done.returncode}):\n{done.stderr}\n(a static "
            f"program needs the C library's static archive: Debian/Ubuntu libc6-dev, "
            f"Fedora glibc-static)"
        )
    return out


def build_mountcheck(out: Path | None = None, *, cc: str = "gcc") -> Path:
    """Build the runtime hook (into native/ unless out is given) and return its path."""
    return compile_program(
        [NATIVE / s for s in MOUNTCHECK_SOURCES], out or NATIVE / MOUNTCHECK_NAME, cc=cc
    )


def build(out: Path | None = None, *, cc: str = "gcc", limits_file: str = "") -> Path:
    """Build the interposer (into native/ unless out is given) and return its path.

    ``limits_file`` replaces the compiled-in ``/etc/gpushare/limits`` (no variable can move it,
    so that a container cannot); only tests, which cannot write /etc, build such a copy.
    """
    defines = (f'-DGPUSHARE_LIMITS_FILE="{limits_file}"',) if limits_file else ()
    return compile_shared(
        [NATIVE / s for s in SOURCES],
        out or NATIVE / LIB_NAME,
        cc=cc,
        extra=("-fvisibility=hidden", *defines),
        libs=INTERPOSER_LIBS,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Build the interposer and the hook; print their paths, or the error and exit 1.

    With an argument, only the interposer, to that path (tests build copies of it).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    cc = os.environ.get("CC") or "gcc"  # a cross compiler when an image for another arch is built
    try:
        paths = [build(Path(args[0]), cc=cc)] if args else [build(cc=cc), build_mountcheck(cc=cc)]
    except BuildError as err:
        print(f"gpushare.isolation.build: {err}", file=sys.stderr)
        return 1
    print("\n".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
