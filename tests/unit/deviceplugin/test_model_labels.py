"""ACK's GPU node labels as the device plugin writes them, and a nodeSelector reading them."""

from __future__ import annotations

import asyncio
import re

import pytest

from gpushare.core.model.gpumodel import (
    LABEL_COUNT,
    LABEL_MEM,
    LABEL_MODEL,
    gpu_node_labels,
    model_label_value,
    pod_models,
)
from gpushare.core.model.inventory import read_node
from gpushare.deviceplugin.config import PluginConfig
from gpushare.kube.memory import MemoryKube
from gpushare.node.gpus import FakeGpus, GpuInfo
from gpushare.node.publishing import publish

LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?$")
"""Kubernetes' rule for a label value."""


@pytest.mark.parametrize(
    ("nvml", "label"),
    [
        ("Tesla T4", "Tesla-T4"),
        ("Tesla V100-SXM2-16GB", "Tesla-V100-SXM2-16GB"),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB"),
        ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3"),
        (" (weird) GPU/2 ", "weird--GPU-2"),
        ("---", ""),
    ],
)
def test_model_label_value_is_a_valid_label(nvml: str, label: str) -> None:
    assert model_label_value(nvml) == label
    assert LABEL_VALUE.match(label)


def test_model_label_value_is_cut_to_63_characters() -> None:
    value = model_label_value("A" * 62 + " B")
    assert len(value) == 62 and LABEL_VALUE.match(value)


def test_labels_say_one_thing_about_every_card() -> None:
    assert gpu_node_labels(["Tesla T4"] * 4, [15360] * 4) == {
        LABEL_MODEL: "Tesla-T4",
        LABEL_COUNT: "4",
        LABEL_MEM: "15360MiB",
    }
    mixed = gpu_node_labels(["Tesla T4", "NVIDIA A10"], [15360, 24576])
    assert mixed == {LABEL_MODEL: None, LABEL_COUNT: "2", LABEL_MEM: None}


def node_object(name: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"ack.node.gpu.schedule": "share"}},
        "status": {"capacity": {}, "allocatable": {}},
    }


def test_publish_labels_the_node_and_the_scheduler_reads_that_model() -> None:
    kube = MemoryKube()
    kube.put_node(node_object("a"))
    kube.put_node(node_object("b"))
    # NVML's names have spaces, which the flag's form cannot carry
    gpus_a = FakeGpus([GpuInfo(i, f"GPU-a-{i}", "Tesla T4", 15360) for i in range(2)])
    gpus_b = FakeGpus.parse("A10:24GiB,T4:15GiB", node="b")
    asyncio.run(publish(kube, gpus_a, PluginConfig(node="a")))
    asyncio.run(publish(kube, gpus_b, PluginConfig(node="b")))
    a = asyncio.run(kube.get_node("a"))
    b = asyncio.run(kube.get_node("b"))
    assert a["metadata"]["labels"][LABEL_MODEL] == "Tesla-T4"
    assert a["metadata"]["labels"][LABEL_COUNT] == "2"
    assert LABEL_MODEL not in b["metadata"]["labels"]
    assert b["metadata"]["labels"][LABEL_COUNT] == "2"
    # the inventory's model is the label's value, the one a nodeSelector names
    assert read_node(a).model == "Tesla-T4"
    pod = {"spec": {"nodeSelector": {LABEL_MODEL: "Tesla-T4"}}}
    assert pod_models(pod) == (read_node(a).model,)
