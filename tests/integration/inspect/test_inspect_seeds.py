"""``kubectl inspect cgpu`` against the seed documents' own example outputs.

The expected text is read from the seeds themselves (``shared/seeds`` beside the clone, or
``$GPUSHARE_SEEDS``), never copied here, so a change on either side fails. Each cluster the
seed describes is built through the in-memory Kubernetes port and rendered by the plugin's own
``collect`` and ``render``.

Seed 001 prints the table as the plugin does, indented by four spaces: it is compared byte for
byte. Seed 000 was published with every run of spaces collapsed to one (and its second example
on one line with the prose after it), so there our output is compared after the same collapse;
the dashed line, which contains no spaces, is still compared whole.
"""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

import pytest

from gpushare.core.model.requests import PodRequest, read_pod
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.allocation import plan
from gpushare.core.records.trust import SealKey, Trust
from gpushare.inspect.cli import collect, render
from gpushare.kube.memory import MemoryKube
from gpushare.kube.objects import gpu_node, gpu_pod, placed

SEEDS = Path(
    os.environ.get("GPUSHARE_SEEDS") or Path(__file__).resolve().parents[4] / "shared" / "seeds"
)

pytestmark = pytest.mark.skipif(
    not SEEDS.is_dir(),
    reason=f"seed documents not found at {SEEDS} (they sit beside the clone in CI; "
    f"set GPUSHARE_SEEDS to their folder)",
)


def seed(prefix: str) -> list[str]:
    [path] = SEEDS.glob(f"{prefix}_*.txt")
    return path.read_text().splitlines()


def summary(node: str, ip: str, *, allocated: int = 0) -> str:
    """``kubectl inspect cgpu`` for one shared node with one 15 GiB GPU, through the port."""
    kube = MemoryKube()
    kube.put_node(gpu_node(node, ip=ip, gpus_units=[15]))
    if allocated:
        pod = gpu_pod("gpu-share-sample-x7k2p", mem=allocated)
        pod = kube.create_pod(pod)
        request = read_pod(pod)
        assert isinstance(request, PodRequest)
        allocation = plan(request, node=node, indexes=[0], unit=MemoryUnit.GiB)
        trust = Trust.sealed(SealKey(kube.seal_key))
        bound = placed(pod, allocation, trust=trust)
        kube.delete_pod("default", pod["metadata"]["name"])
        kube.create_pod(bound)
    return render(asyncio.run(collect(kube)), details=False, output="text")


def collapsed(text: str) -> str:
    return "\n".join(re.sub(" +", " ", line) for line in text.splitlines()) + "\n"


def block_after(lines: list[str], start: int, first: str, last: str) -> list[str]:
    """The lines from the first one starting with ``first`` (after ``start``) to ``last``."""
    begin = next(i for i in range(start, len(lines)) if lines[i].lstrip().startswith(first))
    end = next(i for i in range(begin, len(lines)) if lines[i].strip() == last)
    return lines[begin : end + 1]


def test_seed_001_empty_cluster_byte_for_byte() -> None:
    lines = seed("001")
    command = next(i for i, line in enumerate(lines) if line.strip() == "kubectl inspect cgpu")
    block = block_after(lines, command, "NAME ", "0/15 (0%)")
    assert all(line.startswith("    ") for line in block)
    expected = "\n".join(line[4:] for line in block) + "\n"
    node = expected.splitlines()[1].split()
    assert node[:2] == ["cn-shanghai.192.168.6.104", "192.168.6.104"]  # the cluster we build
    actual = summary("cn-shanghai.192.168.6.104", "192.168.6.104")
    assert actual == expected
    assert len(actual.splitlines()[2]) == 70


def test_seed_000_empty_cluster() -> None:
    lines = seed("000")
    command = next(i for i, line in enumerate(lines) if line.strip() == "kubectl inspect cgpu")
    expected = "\n".join(block_after(lines, command, "NAME ", "0/15 (0%)")) + "\n"
    actual = summary("cn-zhangjiakou.192.168.66.139", "192.168.66.139")
    assert collapsed(actual) == expected
    assert actual.splitlines()[2] == expected.splitlines()[2] == "-" * 75


def test_seed_000_after_the_3_gib_job() -> None:
    lines = seed("000")
    [line] = [x for x in lines if x.startswith("kubectl inspect cgpuExpected output:")]
    following = lines[lines.index(line) + 1]
    actual = summary("cn-zhangjiakou.192.168.66.139", "192.168.66.139", allocated=3)
    one_line = " ".join(collapsed(actual).splitlines())
    assert following.startswith(one_line)
    assert following[len(one_line) :].startswith("Check the following")  # the seed's prose
    assert "-" * 75 + " " in following and "-" * 76 not in following
    assert actual.splitlines()[-1] == "3/15 (20%)"
