"""The files under ``examples/`` are the seed documents' manifests, verbatim.

ACK users apply these manifests unchanged, so gpushare must work with them as written (the
three without ``schedulerName`` reach gpushare through the webhook's steering), and the
examples must not quietly differ. Skipped without ``../shared``.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "src" / "gpushare" / "examples"
SEEDS = ROOT.parent / "shared" / "seeds"

pytestmark = pytest.mark.skipif(not SEEDS.is_dir(), reason=f"no seed documents at {SEEDS}")


def indented_manifest(seed: str, name: str) -> str:
    """The seed's YAML block (indented, up to the first blank line) whose name is ``name``."""
    lines = (SEEDS / seed).read_text().splitlines()
    for start, line in enumerate(lines):
        if not line.strip().startswith("apiVersion:"):
            continue
        end = start
        while end < len(lines) and lines[end].strip():
            end += 1
        block = textwrap.dedent("\n".join(lines[start:end])) + "\n"
        if f"\n  name: {name}\n" in block:
            return block
    raise AssertionError(f"{seed} has no manifest named {name}")


@pytest.mark.parametrize(
    ("example", "seed", "name"),
    [
        ("cuda-sample.yaml", "002_2f3c805a349f6260.txt", "cuda-sample"),
        ("binpack-128mib.yaml", "003_057a7a869342af4f.txt", "binpack"),
        ("tensorflow-mnist-share.yaml", "004_1e236934f9d8686c.txt", "tensorflow-mnist-share"),
    ],
)
def test_example_is_the_seed_manifest(example: str, seed: str, name: str) -> None:
    assert (EXAMPLES / example).read_text() == indented_manifest(seed, name)
    assert "schedulerName" not in (EXAMPLES / example).read_text()  # as the seed wrote it


def test_gputest_is_the_seed_manifest() -> None:
    """The first seed prints GPUtest.yaml on one line: compare with whitespace collapsed."""
    seed = " ".join((SEEDS / "000_f48e5fd88aab02e6.txt").read_text().split())
    example = " ".join((EXAMPLES / "GPUtest.yaml").read_text().split())
    assert example.startswith("apiVersion: batch/v1 kind: Job")
    assert example in seed
