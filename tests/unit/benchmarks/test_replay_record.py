"""The replay benchmark's record of each pod: its node and GPUs, and where two runs part."""

from __future__ import annotations

import json

from gpushare.core.model.names import ANN_ALLOCATION
from gpushare.sim.milligpu import Run
from tests.support.benchmarks import load

replay = load("replay")


def _bound(node: str, gpus: list[dict[str, int]]) -> dict[str, object]:
    record = json.dumps({"node": node, "gpus": gpus})
    return {"metadata": {"annotations": {ANN_ALLOCATION: record}}, "spec": {"nodeName": node}}


def test_a_bound_pod_reads_as_its_node_units_and_gpus() -> None:
    pod = _bound("n1", [{"index": 3, "mem": 8}, {"index": 1, "mem": 8}])
    assert replay.decision_of(pod) == ("bound", "n1", 16, (1, 3))
    assert replay.decision_of({"spec": {"nodeName": "n2"}}) == ("bound", "n2", 0, ())
    failed = {
        "status": {
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "no GPU",
                }
            ]
        }
    }
    assert replay.decision_of(failed) == ("failed", "Unschedulable: no GPU", 0, ())
    assert replay.decision_of({"spec": {}}) is None


def test_runs_that_part_inside_a_node_are_told_apart() -> None:
    def outcome(gpus: list[tuple[int, ...]]) -> object:
        o = replay.Outcome("gpushare", 0, "real", Run())
        o.placed, o.gpus = [0, 1, None], gpus
        return o

    same = outcome([(0,), (2,), ()])
    assert replay.differences(same, outcome([(0,), (2,), ()])) == (0, None)
    assert replay.differences(same, outcome([(0,), (3,), ()])) == (1, 1)
