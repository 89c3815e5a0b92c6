"""Settings validation and the rendered KubeSchedulerConfiguration."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from gpushare.config import ConfigError, load
from gpushare.core.model.units import MemoryUnit
from gpushare.schedconfig import render_yaml, scheduler_configuration

DEPLOYED = Path(__file__).parents[2] / "deploy" / "scheduler-config.yaml"


def test_defaults() -> None:
    settings = load().settings()
    assert settings.unit is MemoryUnit.GiB and settings.policy == "gpushare"
    assert settings.names.mem == "aliyun.com/gpu-mem"


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        (
            {"gpu_memory_unit": "256MiB"},
            "gpu_memory_unit='256MiB': gpuMemoryUnit='256MiB' is not supported",
        ),
        (
            {"policy": "best"},
            "policy='best': policy='best' is not known; choose one of: binpack, fgd, gpushare, "
            "spread",
        ),
        ({"max_pods_per_gpu": 0}, "max_pods_per_gpu=0"),
        ({"colour": "blue"}, "colour='blue'"),
    ],
)
def test_bad_settings_name_field_value_and_rule(values: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        load(**values)
    assert needle in str(err.value)


def test_scheduler_configuration_wires_the_extender() -> None:
    config = scheduler_configuration()
    assert [p["schedulerName"] for p in config["profiles"]] == [
        "default-scheduler",
        "ack-co-scheduler",
    ]
    (extender,) = config["extenders"]
    assert extender["nodeCacheCapable"] is True
    assert (extender["filterVerb"], extender["prioritizeVerb"], extender["bindVerb"]) == (
        "filter",
        "prioritize",
        "bind",
    )
    assert {r["name"] for r in extender["managedResources"]} == {
        "aliyun.com/gpu-mem",
        "aliyun.com/gpu-core.percentage",
    }
    # left to the extender, so its reasons reach FailedScheduling (schedconfig docstring)
    assert all(r["ignoredByScheduler"] is True for r in extender["managedResources"])


def test_deployed_file_is_what_the_command_prints(golden: Callable[[str, str], None]) -> None:
    text = render_yaml(scheduler_configuration())
    assert DEPLOYED.read_text() == text, (
        "regenerate with: gpushare scheduler-config > deploy/scheduler-config.yaml"
    )
    assert yaml.safe_load(text)["kind"] == "KubeSchedulerConfiguration"


def test_the_gpu_profile_leaves_the_choice_to_the_extender_and_the_default_keeps_upstreams() -> (
    None
):
    default, gpu = scheduler_configuration()["profiles"]
    assert default == {"schedulerName": "default-scheduler"}
    assert gpu["plugins"]["score"]["disabled"] == [
        {"name": "NodeResourcesFit"},
        {"name": "NodeResourcesBalancedAllocation"},
        {"name": "ImageLocality"},
    ]
    assert "filter" not in gpu["plugins"], "the generic plugins' filters must stay on"
    assert gpu["percentageOfNodesToScore"] == 100
    args = {c["name"]: c["args"] for c in gpu["pluginConfig"]}
    assert args["PodTopologySpread"] == {"defaultingType": "List", "defaultConstraints": []}


@pytest.mark.parametrize("value", [-1, 101, 50.0, True, "100"])
def test_percentage_of_nodes_to_score_outside_0_to_100_is_refused(value: object) -> None:
    with pytest.raises(ValueError, match=r"percentageOfNodesToScore=.* must be an integer from 0"):
        scheduler_configuration(percentage=value)  # type: ignore[arg-type]
