"""benchmarks/dra_packing.py: its table, and its polite exit without the traces."""

from __future__ import annotations

from pathlib import Path

from gpushare.sim.draplacing import ModeRun
from tests.support import benchmarks


def test_without_the_traces_it_says_so_and_exits_2(tmp_path: Path) -> None:
    dra_packing = benchmarks.load("dra_packing")
    assert dra_packing.main(["--traces", str(tmp_path), "--seeds", "1"]) == 2


def test_the_table_pairs_differences_by_seed() -> None:
    dra_packing = benchmarks.load("dra_packing")
    runs = {
        "first-fit": [
            ModeRun("first-fit", unallocated=20.0),
            ModeRun("first-fit", unallocated=18.0),
        ],
        "dra": [ModeRun("dra", unallocated=10.0), ModeRun("dra", unallocated=9.0)],
    }
    table = dra_packing.table(runs)
    assert "| unallocated % @100% | 19.00 +- 1.41 | 9.50 +- 0.71 |" in table
    assert "| unallocated % @100% | -9.50 +- 0.71 |" in table
