"""The build backend: setuptools, after generating what git does not keep.

``pip wheel .``, ``pip install .`` and ``pip install -e .`` from a clean checkout call this
backend (pyproject.toml's ``[build-system]``), which first writes the two build outputs that the
package carries but git does not keep, then hands over to setuptools:

- the gRPC stubs from gpushare's copies of kubelet's .proto files, the device plugin's and the
  DRA driver's (``src/gpushare/deviceplugin/kubelet/genproto.py``, with grpcio-tools from the
  build requirements);
- the CUDA interposer ``libgpushare-cuda.so`` (``src/gpushare/isolation/build.py``, with gcc).

Both scripts run as files in a child process: importing them as ``gpushare.*`` would import the
package, whose runtime dependencies the isolated build environment does not have. An sdist
carries the sources only; the wheel built from it generates again.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.build_meta import (  # noqa: F401  (the hooks this backend does not change)
    build_sdist,
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)

SRC = Path(__file__).resolve().parents[1] / "src"
STEPS = (
    ("the gRPC stubs", SRC / "gpushare" / "deviceplugin" / "kubelet" / "genproto.py"),
    ("the CUDA interposer and the mount-check hook", SRC / "gpushare" / "isolation" / "build.py"),
)


def _generate() -> None:
    for what, script in STEPS:
        result = subprocess.run(
            [sys.executable, str(script)],
            cwd=SRC.parent,
            # the environment as pip set it: its build environment (grpcio-tools) is on the
            # path it gave this process; the scripts import nothing of gpushare
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"building gpushare: {what} ({script.relative_to(SRC.parent)}) failed with exit "
                f"{result.returncode}:\n{result.stderr.strip() or result.stdout.strip()}\n"
                "The stubs need grpcio-tools (a build requirement pip installs); the interposer "
                "needs gcc (Debian/Ubuntu: apt-get install gcc)."
            )


INTERPOSER = SRC / "gpushare" / "isolation" / "native" / "libgpushare-cuda.so"
ELF_MACHINES = {0x3E: "x86_64", 0xB7: "aarch64"}
"""ELF ``e_machine`` values -> the machine names of wheel platform tags."""


def platform_tag(library: Path) -> str:
    """The wheel platform tag a compiled ``library`` needs: its machine, and as manylinux
    version the newest glibc version it needs (``readelf -V``'s version needs; GLIBC_2.17 ->
    manylinux_2_17).

    The wheel is pure Python but for the interposer, native code for one machine: tagged
    ``any``, pip would install an x86_64 library on an arm64 node.
    """
    data = library.read_bytes()
    if data[:4] != b"\x7fELF" or data[5] != 1:
        raise RuntimeError(f"{library}: not a little-endian ELF file; rebuild the interposer")
    machine = ELF_MACHINES.get(int.from_bytes(data[18:20], "little"))
    if machine is None:
        raise RuntimeError(
            f"{library}: ELF machine {int.from_bytes(data[18:20], 'little'):#x} is none of "
            f"{', '.join(ELF_MACHINES.values())}; build with a compiler for one of them"
        )
    shown = subprocess.run(
        ["readelf", "-V", "--wide", str(library)], capture_output=True, text=True, check=False
    )
    if shown.returncode != 0:
        raise RuntimeError(
            f"readelf -V {library} failed: {shown.stderr.strip()}; readelf comes with gcc's "
            "binutils (Debian/Ubuntu: apt-get install binutils)"
        )
    needs = shown.stdout.partition(".gnu.version_r")[2]
    minors = [int(m) for m in re.findall(r"Name: GLIBC_2\.(\d+)", needs)]
    return f"manylinux_2_{max([17, *minors])}_{machine}"


def build_wheel(
    wheel_directory: str,
    config_settings: dict[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    """Generate, then let setuptools build the wheel, tagged for the interposer's machine."""
    _generate()
    settings = dict(config_settings or {})
    if "--build-option" not in settings:
        settings["--build-option"] = ["--plat-name", platform_tag(INTERPOSER)]
    name: str = _setuptools.build_wheel(wheel_directory, settings, metadata_directory)
    return name


def build_editable(
    wheel_directory: str,
    config_settings: dict[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    """Generate in the source tree (which the editable install points at), then build."""
    _generate()
    name: str = _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
    return name
