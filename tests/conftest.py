"""Shared test helpers: golden files and small object builders."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

GOLDEN = Path(__file__).parent / "golden"


def check_golden(name: str, text: str) -> None:
    """Compare with tests/golden/<name>; GPUSHARE_UPDATE_GOLDEN=1 rewrites it."""
    path = GOLDEN / name
    if os.environ.get("GPUSHARE_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.exists(), f"golden file {path} missing; run with GPUSHARE_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"output differs from {path}"


@pytest.fixture
def golden() -> object:
    return check_golden


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    from tests.support import grpc_loop

    grpc_loop.close()
