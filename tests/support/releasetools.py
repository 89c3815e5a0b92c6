"""The release's tools as packaging/tools.sh caches them, for tests that must not build them.

A test asks for the cached binary at the version tools.sh pins (read from the script, so the
two cannot disagree); where it is missing the test skips, except under CI=true, where it has
tools.sh build it (the Go module proxy is reachable there) rather than skip silently.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / "packaging" / "tools.sh"
BUILD = REPO / "harness" / "controlplane" / "build.sh"
BINARIES = {
    "actionlint": ("ACTIONLINT_VERSION", "actionlint"),
    "oras": ("ORAS_VERSION", "oras"),
    "crane": ("CRANE_VERSION", "crane"),
    "krew": ("KREW_VERSION", "krew"),
    "validate-krew-manifest": ("KREW_VERSION", "validate-krew-manifest"),
    "helm": ("HELM_VERSION", "helm"),
}


def pinned_version(variable: str) -> str:
    """``VARIABLE=value`` in tools.sh, else in build.sh (helm's)."""
    for script in (TOOLS, BUILD):
        found = re.search(rf"^{variable}=(v[\w.\-]+)", script.read_text(), re.M)
        if found:
            return found.group(1)
    raise AssertionError(f"{variable} is pinned in neither {TOOLS.name} nor {BUILD.name}")


def cached_tool(name: str) -> Path | None:
    variable, binary = BINARIES[name]
    cache = Path(os.environ.get("GPUSHARE_CACHE", Path.home() / ".cache" / "gpushare"))
    path = cache / "bin" / f"{name}-{pinned_version(variable)}" / binary
    return path if os.access(path, os.X_OK) else None


def release_tools(*names: str) -> dict[str, Path]:
    """The cached tools by name; skips the test (builds them under CI=true) when any is missing."""
    missing = [name for name in names if cached_tool(name) is None]
    if missing and os.environ.get("CI") == "true":
        built = subprocess.run(
            ["bash", str(TOOLS), *missing], cwd=REPO, capture_output=True, text=True, check=False
        )
        assert built.returncode == 0, built.stderr
    elif missing:
        pytest.skip(f"release tools not built ({', '.join(missing)}): bash packaging/tools.sh")
    found = {name: cached_tool(name) for name in names}
    return {name: path for name, path in found.items() if path is not None}


def packaging_module(name: str) -> ModuleType:
    """A module of packaging/ (not importable by name: pip's ``packaging`` holds it)."""
    sys.path.insert(0, str(REPO / "packaging"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(REPO / "packaging"))
