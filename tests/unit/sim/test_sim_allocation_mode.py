"""`gpushare simulate --allocation-mode dra`: the memory replay through DRA mode's placement.

DRA mode's accounting is what the claims' status records, read back through the DRA ledger
(``sim.draplacing.DraCluster``); gpushare's DRA allocator makes the device plugin's decisions,
so on the same seed the two modes' curves are the same, pod for pod, pods that name a GPU model
(a required node affinity on the Node's label) included.
"""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from gpushare.cli import main
from gpushare.sim import gpumem, synthetic
from gpushare.sim.draplacing import DraCluster
from gpushare.sim.experiment import run_seed

QUICK = ["simulate", "--seeds", "1", "--workers", "1", "--policy", "gpushare"]


def test_dra_mode_replays_as_the_device_plugin_mode() -> None:
    nodes = synthetic.nodes()[:12]
    pods = synthetic.pods(nodes)
    plugin = run_seed(nodes, pods, "gpushare", 0, 1.1, memory=gpumem.MemorySettings())
    dra = run_seed(
        nodes, pods, "gpushare", 0, 1.1, memory=gpumem.MemorySettings(allocation_mode="dra")
    )
    # repr: the curve's points past the last arrival are NaN, which equals nothing
    assert repr(dra.points) == repr(plugin.points) and repr(dra.curve) == repr(plugin.curve)
    # the same pods fail; DRA mode names the reasons by the allocator's step (no node, filter)
    assert sum(dra.failed.values()) == sum(plugin.failed.values()) == 18
    assert dra.pods == plugin.pods


def test_a_dra_replay_counts_what_the_claims_hold() -> None:
    nodes = synthetic.nodes()[:4]
    stream = gpumem.stream(
        synthetic.pods(nodes), nodes, seed=1, tune=1.0, unit=gpumem.MemorySettings().unit
    )
    cluster = DraCluster(nodes, policy="gpushare", seed=1)
    booked = sum(cluster.place(pod, str(i))[0] for i, pod in enumerate(stream[:40]))
    claimed = sum(a.mem_units for a in cluster.ledger.claims())
    assert booked == claimed > 0
    # every claim's share is on a GPU its node's slice publishes, within the GPU's memory
    for allocation in cluster.ledger.claims():
        spec = cluster.dra.nodes[allocation.node]
        sizes = {g.index: g.mem_units for g in spec.gpus}
        assert all(s.index in sizes for s in allocation.gpus)
    for name, spec in cluster.dra.nodes.items():
        usage = cluster.ledger.usage(name)
        assert all(usage.on(g.index).mem_units <= g.mem_units for g in spec.gpus)


def test_simulate_in_dra_mode_says_so(tmp_path: Path) -> None:
    out = tmp_path / "r"
    result = CliRunner().invoke(main, [*QUICK, "--allocation-mode", "dra", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0].startswith("model: what the chart deploys in DRA mode")
    document = json.loads((out / "report.json").read_text())
    assert document["trace"] == "synthetic (memory, 1GiB, share, DRA mode)"
    milli = CliRunner().invoke(
        main,
        [
            *QUICK[:-2],
            "--accounting",
            "milli",
            "--allocation-mode",
            "dra",
            "--out",
            str(tmp_path / "m"),
        ],
    )
    assert (
        milli.exit_code == 2 and "--allocation-mode dra runs in memory accounting" in milli.output
    )
