"""The interposer, the fake driver and NVML and the test programs, built once per test module."""

from __future__ import annotations

import pytest

from harness.fakegpu.built import Built, build_all


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return build_all(tmp_path_factory.mktemp("native"))
