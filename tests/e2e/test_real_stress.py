"""A randomized stress on the real node: hundreds of pods of mixed shapes, created and deleted
concurrently, admitted by the real kubelet in whatever order it takes them.

Every container that ran is compared with its pod's ``gpushare.io/allocation``; the test prints
the number of containers checked, the mismatches (the goal is 0) and the pods left Pending with
why. ``GPUSHARE_STRESS_PODS`` sets the number of pods (default 500). The run itself
(``tests.support.realnode.run_stress``) is the one DRA mode's stress runs too
(``test_real_dra.py``).
"""

from __future__ import annotations

import os
import random
from typing import Any

import pytest

from harness.realnode import RealNode
from tests.support.realnode import NS, compare, fresh_namespace, gpu_uuids, run_stress

TOTAL = int(os.environ.get("GPUSHARE_STRESS_PODS", "500"))


def test_randomized_stress_on_the_real_node(
    real_node: RealNode, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = real_node.cluster
    real_node.set_mode("share", unit="1GiB", fake_gpus="8x32GiB")
    fresh_namespace(cluster)
    rng = random.Random(int(os.environ.get("GPUSHARE_STRESS_SEED", "13")))
    uuids = gpu_uuids(cluster)

    def check(items: list[dict[str, Any]]) -> tuple[int, list[str]]:
        checked, wrong, _ = compare(items, uuids, real_node.device_list_strategy)
        return checked, wrong

    try:
        run = run_stress(cluster, rng, TOTAL, check)
        with capsys.disabled():
            print(f"\n{run.summary()}", flush=True)
            for line in run.mismatches[:20] + run.pending[:20]:
                print(f"[stress]   {line}", flush=True)
        assert run.created == TOTAL
        assert not run.mismatches, run.mismatches[:20]
        assert not run.pending, run.pending[:20]
        assert run.checked >= len(run.finished)
    finally:
        # the module's node is torn down next (its pods deleted, kubelet stopped) and a later
        # test's fresh namespace waits for this one to be gone: waiting here (about 115 s after
        # 500 pods) and setting the node's GPUs back would be work no test reads
        cluster.kubectl("delete", "namespace", NS, "--wait=false", check=False)
