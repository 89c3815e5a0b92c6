"""The hand-off's pure parts: strategy and kind checks, reading CDI spec files."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gpushare.cli import main as gpushare
from gpushare.node.cdi import (
    MAX_SPEC_BYTES,
    VOID,
    HandOff,
    HandOffError,
    Strategy,
    devices_of,
    parse_kind,
    parse_strategy,
    scan,
)


def test_strategies_are_nvidia_s_names_and_anything_else_is_refused_with_the_choices() -> None:
    assert parse_strategy("cdi-cri") is Strategy.CDI_CRI
    assert parse_strategy("envvar") is Strategy.ENVVAR
    choices = r"--device-list-strategy='cdi' is not .* use envvar, cdi-cri"
    with pytest.raises(HandOffError, match=choices):
        parse_strategy("cdi")


@pytest.mark.parametrize("kind", ["nvidia.com/gpu", "example.com/gpu", "k8s.example.org/dev-1"])
def test_a_kind_is_vendor_slash_class(kind: str) -> None:
    assert parse_kind(kind) == kind


@pytest.mark.parametrize(
    "kind",
    ["gpu", "nvidia/gpu", "nvidia.com/", "/gpu", "nvidia.com/g u", "9vendor.com/gpu", "x.com/9gpu"],
)
def test_a_kind_that_is_not_vendor_slash_class_is_refused(kind: str) -> None:
    with pytest.raises(HandOffError, match="is not a CDI kind"):
        parse_kind(kind)


def test_only_the_kind_s_well_formed_device_names_count() -> None:
    spec = {"kind": "nvidia.com/gpu", "devices": [{"name": "0"}, {"name": "bad name"}, {}, "x"]}
    assert devices_of(spec, "nvidia.com/gpu") == ["0"]
    assert devices_of(spec, "example.com/gpu") is None
    assert devices_of({"kind": "nvidia.com/gpu"}, "nvidia.com/gpu") == []
    assert devices_of(["not", "a", "spec"], "nvidia.com/gpu") is None


def test_scan_reads_yaml_and_json_skips_the_rest_and_says_what_it_could_not_read(
    tmp_path: Path,
) -> None:
    (tmp_path / "a.yaml").write_text("kind: nvidia.com/gpu\ndevices:\n- name: GPU-1\n")
    (tmp_path / "b.json").write_text('{"kind": "nvidia.com/gpu", "devices": [{"name": "GPU-2"}]}')
    (tmp_path / "c.yml").write_text("kind: nvidia.com/gpu\ndevices: [")  # broken
    (tmp_path / "d.txt").write_text("kind: nvidia.com/gpu\ndevices:\n- name: GPU-3\n")
    (tmp_path / "e.yaml").write_bytes(b"x" * (MAX_SPEC_BYTES + 1))
    (tmp_path / "f.yaml").write_text("kind: example.com/fpga\ndevices:\n- name: GPU-4\n")
    found = scan([tmp_path, tmp_path / "absent"], "nvidia.com/gpu")
    assert found.names == {"GPU-1", "GPU-2"}
    assert [Path(f).name for f in found.files] == ["a.yaml", "b.json"]
    assert [Path(s.split(":")[0]).name for s in found.skipped] == ["c.yml", "e.yaml"]


def test_envvar_names_the_uuids_and_cdi_cri_names_devices_once_and_voids_the_variable() -> None:
    uuids = ["GPU-a", "GPU-b"]
    assert HandOff().answer(uuids, carries_devices=True) == ("GPU-a,GPU-b", ())
    cdi = HandOff(Strategy.CDI_CRI, kind="example.com/gpu")
    assert cdi.answer(uuids, carries_devices=True) == (
        VOID,
        ("example.com/gpu=GPU-a", "example.com/gpu=GPU-b"),
    )
    assert cdi.answer(uuids, carries_devices=False) == (VOID, ())
    assert HandOff().refusal(uuids) is None  # envvar needs no spec


def test_the_command_refuses_a_bad_strategy_or_kind_by_name() -> None:
    base = ["device-plugin", "--node-name=n", "--insecure-no-seal"]
    result = CliRunner().invoke(gpushare, [*base, "--device-list-strategy", "volume-mounts"])
    assert result.exit_code == 2
    assert "'volume-mounts' is not a device-list strategy" in result.output
    result = CliRunner().invoke(gpushare, [*base, "--cdi-kind", "gpu"])
    assert result.exit_code == 2
    assert "--cdi-kind='gpu' is not a CDI kind" in result.output
