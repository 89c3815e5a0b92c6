"""The core stays pure: no API client, HTTP, gRPC, NVML or socket imports."""

from __future__ import annotations

import ast
from pathlib import Path

import gpushare.core

FORBIDDEN = {
    "lightkube",
    "kubernetes",
    "httpx",
    "httpx2",
    "fastapi",
    "starlette",
    "uvicorn",
    "grpc",
    "pynvml",
    "socket",
    "asyncio",
    "requests",
    "urllib",
    "subprocess",
    "gpushare.kube",
    "gpushare.extender",
    "gpushare.inspect",
}


def test_core_imports_nothing_that_does_io() -> None:
    root = Path(gpushare.core.__file__).parent
    offenders = []
    for path in sorted(root.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                if any(name == f or name.startswith(f + ".") for f in FORBIDDEN):
                    offenders.append(f"{path.name}: {name}")
    assert offenders == []


def test_only_one_module_imports_the_kubernetes_client() -> None:
    root = Path(gpushare.core.__file__).parent.parent
    users = sorted(
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if "import lightkube" in p.read_text() or "from lightkube" in p.read_text()
    )
    assert users == ["kube/lightkube_api.py"]


def test_only_the_device_plugins_wire_adapters_import_grpc() -> None:
    """Allocate's answer, the checkpoint, preflight and publishing stay free of gRPC."""
    root = Path(gpushare.core.__file__).parent.parent / "deviceplugin"
    users = sorted(
        p.name
        for p in root.glob("*.py")
        if any(
            line.startswith(("import grpc", "from grpc", "from gpushare.deviceplugin.protos"))
            for line in p.read_text().splitlines()
        )
    )
    assert users == ["reconcile.py", "registration.py", "servicer.py"]
