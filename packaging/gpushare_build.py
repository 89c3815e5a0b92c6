"""The build backend: setuptools, after generating what git does not keep.

``pip wheel .``, ``pip install .`` and ``pip install -e .`` from a clean checkout call this
backend (pyproject.toml's ``[build-system]``), which first writes the two build outputs that the
package carries but git does not keep, then hands over to setuptools:

- the gRPC stubs from gpushare's copies of kubelet's .proto files
  (``src/gpushare/deviceplugin/genproto.py``, with grpcio-tools from the build requirements);
- the CUDA interposer ``libgpushare-cuda.so`` (``src/gpushare/isolation/build.py``, with gcc).

Both scripts run as files in a child process: importing them as ``gpushare.*`` would import the
package, whose runtime dependencies the isolated build environment does not have. An sdist
carries the sources only; the wheel built from it generates again.
"""

from __future__ import annotations

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
    ("the gRPC stubs", SRC / "gpushare" / "deviceplugin" / "genproto.py"),
    ("the CUDA interposer", SRC / "gpushare" / "isolation" / "build.py"),
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


def build_wheel(
    wheel_directory: str,
    config_settings: dict[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    """Generate, then let setuptools build the wheel."""
    _generate()
    name: str = _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)
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
