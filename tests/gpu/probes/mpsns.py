"""The plugin's MPS hook in a PID namespace of its own, as with the plugin's ``hostPID`` off.

``unshare --pid --fork python -m tests.gpu.probes.mpsns WORK REHEARSAL``: starts the control
daemon for GPU 0 as ``MpsIsolation.extend`` does for a 2 GiB, 30 % container, prints one JSON
line (the answer's envs and the pipe directory), then holds the daemon until stdin closes and
stops it. The clients run outside, in the PID namespace the run started in, as a pod's do.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from gpushare.core.model.inventory import Mode
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.handoff import MEM, Pending, Signature
from gpushare.node.enforcement.hook import ContainerAnswer, Target
from gpushare.node.enforcement.mps import MpsIsolation
from gpushare.node.enforcement.mpsdaemon import MpsControl
from gpushare.node.gpus import FakeGpus, GpuInfo, GpuSource, NvmlGpus


def main(work: Path, rehearsal: bool) -> int:
    source: GpuSource
    source = FakeGpus([GpuInfo(0, "GPU-fake-0", "fake", 16384)]) if rehearsal else NvmlGpus()
    runner = MpsControl()
    hook = MpsIsolation(
        runner=runner, state_dir=work / "state-ns", source=source, unit=MemoryUnit.GiB
    )
    if missing := hook.prepare(Mode.MPS):
        print(json.dumps({"error": missing}), flush=True)
        return 0
    signature = Signature(MEM, 2, ((0, 2),), 2, ((0, 30),))
    target = Target(
        signature, Mode.MPS, (Pending("uid-ns", "default/mps-ns", "c0", signature),), ("dev-ns",)
    )
    try:
        answer = hook.extend(ContainerAnswer(envs={}), target)
        pipe = Path(answer.mounts[-1][1])
        print(
            json.dumps(
                {
                    "pid_in_namespace": os.getpid(),
                    "envs": dict(answer.envs),
                    "pipe": str(pipe),
                    "alive": runner.alive(pipe),
                }
            ),
            flush=True,
        )
        sys.stdin.read()
    finally:
        hook.close()
    print(json.dumps({"alive_after_close": runner.alive(pipe)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1]), sys.argv[2] == "1"))
