"""The built-in workloads: the openb-like default stays as it was, the stress knobs do what
they say, the same seed gives the same pods, and bad knobs are errors that say what to do."""

from __future__ import annotations

import hashlib
import statistics
from collections.abc import Callable
from pathlib import Path

import pytest

from gpushare.sim import synthetic
from gpushare.sim.openb import TraceNode, TracePod
from gpushare.sim.synthetic import Mix, MixError
from tests.support import benchmarks

NODES = synthetic.nodes()
CAPACITY = sum(n.gpus for n in NODES) * 1000
FILL = 6.0
"""Six clusters' worth of GPU request: enough pods that shares sit close to their knobs."""


def digest(pods: list[TracePod]) -> str:
    return hashlib.sha256(repr(pods).encode()).hexdigest()


def test_the_default_workload_is_the_one_it_always_was() -> None:
    pods = synthetic.pods(NODES)
    assert len(pods) == 614
    assert digest(pods) == "952a585b254b28359e47cbc6ede8e825bc659376b7bf21a1b8719d13549b09c9"
    assert synthetic.pods(NODES, mix=synthetic.workload("default")) == pods
    assert digest(synthetic.pods(NODES, seed=7)) == (
        "02c1e06cbea1f36585297930df4c111e40b5617d7671e234a6f472d127461bde"
    )


@pytest.mark.parametrize("name", synthetic.STRESS)
def test_every_workload_is_deterministic_per_seed(name: str) -> None:
    mix = synthetic.workload(name)
    first = synthetic.pods(NODES, seed=3, mix=mix)
    assert synthetic.pods(NODES, seed=3, mix=mix) == first
    assert synthetic.pods(NODES, seed=4, mix=mix) != first
    assert 0.95 < sum(p.gpu_request_milli for p in first) / CAPACITY <= 0.98


def share(pods: list[TracePod], test: Callable[[TracePod], bool]) -> float:
    return sum(test(p) for p in pods) / len(pods)


def cells(row: str) -> list[str]:
    return [cell.strip() for cell in row.split("|")[1:-1]]


def test_multigpu_asks_for_two_to_eight_gpus_in_a_third_of_the_pods() -> None:
    pods = synthetic.pods(NODES, fill=FILL, mix=synthetic.workload("multigpu"))
    multi = [p for p in pods if p.num_gpu > 1]
    assert len(multi) / len(pods) == pytest.approx(0.35, abs=0.03)
    assert share(pods, lambda p: p.num_gpu == 0) == pytest.approx(0.10, abs=0.03)
    assert {p.num_gpu for p in multi} == {2, 3, 4, 6, 8}
    assert all(p.gpu_milli == 1000 for p in multi)
    default = synthetic.pods(NODES, fill=FILL)
    assert share(default, lambda p: p.num_gpu > 1) < 0.03


def test_models_restricts_half_the_gpu_pods_to_one_or_two_models_by_capacity() -> None:
    pods = synthetic.pods(NODES, fill=FILL, mix=synthetic.workload("models"))
    gpu = [p for p in pods if p.num_gpu]
    restricted = [p for p in gpu if p.gpu_spec]
    assert len(restricted) / len(gpu) == pytest.approx(0.5, abs=0.04)
    assert {len(p.gpu_spec) for p in restricted} == {1, 2}
    assert all(list(p.gpu_spec) == sorted(set(p.gpu_spec)) for p in restricted)
    single = [p.gpu_spec[0] for p in restricted if len(p.gpu_spec) == 1]
    # G2 holds 320 of the 468 GPUs: drawn by capacity it is about 68 % of the single picks
    assert single.count("G2") / len(single) == pytest.approx(320 / 468, abs=0.06)
    assert single.count("P100") / len(single) == pytest.approx(16 / 468, abs=0.03)


def test_cpuheavy_asks_more_cpu_than_the_cluster_has_before_its_gpus_are_asked() -> None:
    heavy = synthetic.pods(NODES, mix=synthetic.workload("cpuheavy"))
    default = synthetic.pods(NODES)
    cluster_cpu = sum(n.cpu_milli for n in NODES)
    assert sum(p.cpu_milli for p in heavy) > cluster_cpu  # at 98 % of the GPUs
    assert sum(p.cpu_milli for p in default) < 0.6 * cluster_cpu
    ratio = statistics.fmean(p.cpu_milli for p in heavy) / statistics.fmean(
        p.cpu_milli for p in default
    )
    assert ratio == pytest.approx(2.0, abs=0.25)
    assert min(p.cpu_milli for p in heavy) >= 4_000


def test_mixed_combines_the_three() -> None:
    pods = synthetic.pods(NODES, fill=FILL, mix=synthetic.workload("mixed"))
    gpu = [p for p in pods if p.num_gpu]
    assert share(pods, lambda p: p.num_gpu > 1) == pytest.approx(0.20, abs=0.03)
    assert sum(bool(p.gpu_spec) for p in gpu) / len(gpu) == pytest.approx(0.30, abs=0.04)
    assert statistics.fmean(p.cpu_milli for p in pods if p.num_gpu == 1) > 14_000


def test_an_unknown_workload_names_the_known_ones() -> None:
    with pytest.raises(MixError, match=r"workload='multi' is not known.*multigpu, models"):
        synthetic.workload("multi")


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"multi_gpu": 1.5}, r"multi_gpu=1\.5: a share of pods must be between 0 and 1; give"),
        ({"restricted": -0.1}, r"restricted=-0\.1: a share of pods must be between 0 and 1"),
        ({"cpu_only": float("nan")}, r"cpu_only=nan: a share"),
        ({"fractional": 0.6, "multi_gpu": 0.5}, r"= 1\.23: the shares must total at most 1"),
        ({"multi_sizes": (1, 2)}, r"multi_sizes=\(1, 2\): a multi-GPU pod asks for 2 to 64"),
        ({"multi_sizes": ()}, r"multi_sizes=\(\): .*at least one count"),
        ({"models_per_pod": (0,)}, r"models_per_pod=\(0,\): a restricted pod accepts at least"),
        ({"cpu_milli": (0, 1000)}, r"cpu_milli=\(0, 1000\): every pod asks for some CPU"),
    ],
)
def test_a_bad_knob_names_the_field_the_value_and_the_rule(
    knobs: dict[str, object], message: str
) -> None:
    with pytest.raises(MixError, match=message):
        Mix(**knobs)  # type: ignore[arg-type]


def test_knobs_the_cluster_cannot_serve_are_errors() -> None:
    small = [TraceNode("t4-0", 64_000, 262_144, 2, "T4"), TraceNode("p-0", 64_000, 1, 4, "P100")]
    with pytest.raises(MixError, match=r"the cluster has 2 GPU model\(s\); keep the counts at"):
        synthetic.pods(small, mix=Mix(models_per_pod=(1, 3)))
    with pytest.raises(MixError, match="no node has a GPU"):
        synthetic.pods([TraceNode("cpu", 64_000, 1, 0, "")])
    for fill in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(MixError, match=r"fill=.*positive, finite share"):
            synthetic.pods(NODES, fill=fill)
    both = synthetic.pods(small, mix=Mix(restricted=1.0, models_per_pod=(2,)), fill=3.0)
    assert {p.gpu_spec for p in both if p.num_gpu} == {("P100", "T4")}


def test_the_stress_table_on_a_small_cluster(tmp_path: Path) -> None:
    stress_table = benchmarks.load("stress_table")
    said: list[str] = []
    small = NODES[::6]  # 15 nodes, 8-GPU ones among them
    rows = stress_table.table(["mixed"], 2, cluster=small, out=tmp_path, say=said.append)
    assert rows[0].startswith("| trace | policy | at 100% arrived | at 130% arrived | minus FGD")
    assert [cells(row)[1] for row in rows[2:]] == ["bestfit", "fgd", "gpushare", "offline-ffd"]
    gpushare = cells(rows[4])
    assert gpushare[0] == "mixed" and len(gpushare) == 6
    assert all("+-" in cell for cell in gpushare[2:])
    assert cells(rows[3])[4:] == ["", ""]  # fgd against itself: blank
    assert said[0].startswith("mixed: ") and said.count(".") == 8 and said[-1].endswith(" s\n")
    assert (tmp_path / "mixed" / "report.json").exists()


def test_the_noise_floor_pairs_fgd_with_itself_on_the_same_stream() -> None:
    noise_floor = benchmarks.load("noise_floor")
    small = NODES[::6]
    workload = synthetic.pods(small, mix=synthetic.workload("multigpu"), fill=1.3)
    # at the paper's own coverage the two policies are one: the same placements, the same value
    same = noise_floor.one_seed(small, workload, 0, 0.95)
    assert same[0] == same[1] and 0.0 <= same[0] <= 100.0
    # all shapes in the measure: still a value of the protocol, on the very same stream
    first, other = noise_floor.one_seed(small, workload, 0, 1.0)
    assert first == same[0] and 0.0 <= other <= 100.0
