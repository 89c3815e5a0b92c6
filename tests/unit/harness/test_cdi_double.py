"""The real node's CDI spec double: named as the toolkit names GPUs, valid by the CDI rules, and
accepted by the device plugin's own check of the node's specs."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import yaml

from gpushare.node.cdi import HandOff, Strategy, devices_of, scan
from gpushare.node.gpus import FakeGpus
from harness.cdi_double import (
    CDI_VERSION,
    KIND,
    SPEC_FILE,
    FakeGpu,
    expected,
    name_problems,
    seen,
    spec,
    write,
)

NODE = "gpushare-real-0"


def fake(spec_text: str = "4x15GiB") -> list[FakeGpu]:
    """The GPUs and UUIDs the plugin's fake source reports on the real node."""
    return [FakeGpu(g.index, g.uuid) for g in FakeGpus.parse(spec_text, node=NODE).gpus()]


def test_each_gpu_is_named_by_index_and_by_uuid_with_the_same_edits_then_all() -> None:
    gpus = fake("3x15GiB")
    doc = spec(gpus, Path("/nodes"))
    assert (doc["cdiVersion"], doc["kind"]) == (CDI_VERSION, "nvidia.com/gpu")
    names = [d["name"] for d in doc["devices"]]
    assert names == ["0", gpus[0].uuid, "1", gpus[1].uuid, "2", gpus[2].uuid, "all"]
    by_name = {d["name"]: d["containerEdits"] for d in doc["devices"]}
    assert (
        by_name["1"]
        == by_name[gpus[1].uuid]
        == {
            "env": [f"GPUSHARE_FAKE_CDI_DEVICE_1={gpus[1].uuid}"],
            "deviceNodes": [{"path": "/dev/nvidia1", "hostPath": "/nodes/nvidia1"}],
        }
    )
    assert [n["path"] for n in by_name["all"]["deviceNodes"]] == [
        "/dev/nvidia0",
        "/dev/nvidia1",
        "/dev/nvidia2",
    ]


def test_the_plugins_spec_check_finds_every_fake_uuid(tmp_path: Path) -> None:
    gpus = fake("8x32GiB")
    (tmp_path / SPEC_FILE).write_text(yaml.safe_dump(spec(gpus, tmp_path / "dev")))
    assert set(devices_of(yaml.safe_load((tmp_path / SPEC_FILE).read_text()), KIND) or []) >= {
        g.uuid for g in gpus
    }
    handoff = HandOff(strategy=Strategy.CDI_CRI, spec_dirs=(tmp_path,))
    assert handoff.refusal([g.uuid for g in gpus]) is None
    assert scan([tmp_path], KIND).files == (str(tmp_path / SPEC_FILE),)


@pytest.mark.parametrize(
    ("kind", "names", "wrong"),
    [
        ("nvidia.com/gpu", ["0", "GPU-1a2b", "all", "mig0:1"], []),
        ("9vendor.com/gpu", ["0"], ["kind '9vendor.com/gpu'"]),
        ("nvidia.com", ["0"], ["kind 'nvidia.com'"]),
        ("nvidia.com/gpu", ["-0", "GPU 1", "gpu-"], ["'-0'", "'GPU 1'", "'gpu-'"]),
    ],
)
def test_names_follow_the_cdi_rules(kind: str, names: list[str], wrong: list[str]) -> None:
    problems = name_problems(kind, names)
    assert len(problems) == len(wrong)
    for problem, fragment in zip(problems, wrong, strict=True):
        assert fragment in problem


def test_a_uuid_the_runtime_would_refuse_stops_the_double() -> None:
    with pytest.raises(ValueError, match="device name 'GPU 0'"):
        spec([FakeGpu(0, "GPU 0")], Path("/nodes"))


def test_what_a_container_must_see_is_what_a_probe_of_exactly_its_gpus_reports() -> None:
    gpus = fake()
    placed = [gpus[3], gpus[1]]
    env = {
        "PROBE_DEVICES": "/dev/nvidia1,/dev/nvidia3",
        "GPUSHARE_FAKE_CDI_DEVICE_3": gpus[3].uuid,
        "GPUSHARE_FAKE_CDI_DEVICE_1": gpus[1].uuid,
        "GPUSHARE_MODE": "share",
    }
    assert seen(env) == expected(placed)
    assert seen({**env, "GPUSHARE_FAKE_CDI_DEVICE_0": gpus[0].uuid}) != expected(placed)
    assert seen({}) == expected([]) == ("", "")


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
def test_written_nodes_are_dev_null_s_numbers_and_a_rewrite_replaces_the_file(
    tmp_path: Path,
) -> None:
    spec_dir, node_dir = tmp_path / "cdi", tmp_path / "dev"
    path = write(spec_dir, node_dir, fake("2x15GiB"))
    assert path == spec_dir / SPEC_FILE
    for i in (0, 1):
        info = (node_dir / f"nvidia{i}").stat()
        assert stat.S_ISCHR(info.st_mode) and info.st_rdev == os.stat("/dev/null").st_rdev
    write(spec_dir, node_dir, fake("4x15GiB"))
    assert sorted(p.name for p in spec_dir.iterdir()) == [SPEC_FILE]
    doc = yaml.safe_load(path.read_text())
    assert [d["name"] for d in doc["devices"]][-3:] == ["3", fake()[3].uuid, "all"]
