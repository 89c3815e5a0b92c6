"""The DRA packing replay: DRA mode places as device-plugin mode does, first-fit as upstream."""

from __future__ import annotations

import pytest

from gpushare.sim import draplacing
from gpushare.sim.openb import TraceNode, TracePod

NODES = [TraceNode(f"n{i}", 32000, 131072, 4, "T4") for i in range(6)]


def _stream(count: int) -> list[TracePod]:
    shares = (250, 500, 1000, 330, 750, 120)
    return [
        TracePod(f"p{i}", 2000, 4096, 2 if i % 11 == 0 else 1, shares[i % len(shares)])
        for i in range(count)
    ]


@pytest.mark.parametrize("policy", ["gpushare", "binpack"])
def test_dra_mode_places_as_device_plugin_mode(policy: str) -> None:
    stream = _stream(60)
    dra = draplacing.run_mode("dra", NODES, stream, seed=3, policy=policy)
    plugin = draplacing.run_mode("device-plugin", NODES, stream, seed=3, policy=policy)
    assert dra.curve == plugin.curve
    assert (dra.gpus_used, dra.fragmented, dra.failed) == (
        plugin.gpus_used,
        plugin.fragmented,
        plugin.failed,
    )


def test_first_fit_takes_devices_in_published_order() -> None:
    cluster = draplacing.FirstFitCluster(NODES[:1], seed=0, by_order=True)
    for step in range(3):
        booked, reason = cluster.place(TracePod(f"p{step}", 100, 100, 1, 250), str(step))
        assert booked and not reason
    free = cluster.free[0]
    assert free[0] < free[1] == free[2] == free[3]  # all three on gpu-0, the first with room


def test_an_unknown_mode_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="best-fit"):
        draplacing.run_mode("best-fit", NODES, _stream(1), seed=0)
