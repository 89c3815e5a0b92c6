"""``benchmarks/trip.py``: how often control comes back up from the core to the extender.

The verbs' values carry what the adapter answers, counts, logs and tells with (the placement
Event's message and the log fields in ``BindPlan``, the outcomes' flags), so the extender does
not call back into the core for them; these counts hold it there.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.support import benchmarks


def test_each_verb_asks_the_core_once_and_answers_from_its_value(tmp_path: Path) -> None:
    trip = benchmarks.load("trip")
    traced, served = asyncio.run(trip.trip(tmp_path))
    assert served
    returns = {verb: traced[verb].returns for verb in ("filter", "prioritize", "bind", "allocate")}
    # bind: reserve_bind, and copy_will_do (whether the watch's copy of the pod will do);
    # allocate: the node's pods judged (NodeJudge.read), the answer, and the plugin's settings
    # and GPU source reading the memory unit (max pods per GPU, MiB per unit)
    assert returns == {"filter": 1, "prioritize": 1, "bind": 2, "allocate": 4}
