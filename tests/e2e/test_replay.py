"""The openb replay, small: the real control plane places as the memory-mode simulator does.

``benchmarks/replay.py`` (``make replay``) sends the whole trace; this is the same code on a
slice (40 nodes spread over the node list, the first 400 pods of seed 0's stream, every
policy), on its own control plane so that no other test's nodes, pods or extender policy
count. Unallocated GPU memory must agree within half a point at 100 % arrived or, when the
slice stops before, at its last pod. It skips when the shared traces are not beside the project.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.cluster import Cluster
from tests.support import benchmarks

NODES = 40
PODS = 400
SEED = 0
POLICIES = ("binpack", "fgd", "gpushare")
TOLERANCE = 0.5


replay = benchmarks.load("replay")


@pytest.fixture(scope="module")
def replay_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if not replay.TRACES.exists():
        pytest.skip(f"the openb traces are not at {replay.TRACES}")
    root = tmp_path_factory.mktemp("replay-cluster")
    with replay.replay_cluster(root, lambda line: print(f"[e2e replay] {line}", flush=True)) as c:
        yield c


def test_a_slice_of_openb_places_as_the_simulator_does(
    replay_cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = replay.sliced(replay.read_nodes(replay.TRACES / replay.NODE_LIST), NODES)
    pods = replay.read_pods(replay.TRACES / "openb_pod_list_default.csv")
    load = replay.workload(nodes, pods, seed=SEED, limit=PODS)
    real = replay.RealReplay(replay_cluster, load, lambda line: print(line, flush=True))
    pairs = []
    try:
        real.make_nodes()
        for policy in POLICIES:
            pairs.append((real.run(policy), replay.simulate(load, policy)))
    finally:
        real.close()
    with capsys.disabled():
        print("\n" + replay.table(pairs), flush=True)
    for ours, theirs in pairs:
        where, a, b = replay.agreement_point(ours, theirs)
        assert abs(a - b) <= TOLERANCE, (
            f"{ours.policy}: real {a:.2f} % vs simulator {b:.2f} % unallocated at {where}"
        )
