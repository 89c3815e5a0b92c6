"""The autoscalers' node groups as harness.autoscalers describes them: templates that carry what
gpushare's device plugin publishes, and the stand-in's patch for the nodes they create."""

from __future__ import annotations

import json

from gpushare.core.model.names import ANN_NODE_GPUS, ANN_NODE_UNIT
from gpushare.core.model.units import MemoryUnit
from harness.autoscalers import (
    CA_GROUP_ANNOTATION,
    GROUP_LABEL,
    HOSTNAME_LABEL,
    GpuShape,
    gpu_instance_type,
    gpu_template,
    node_agent_patch,
    node_of_group,
    nodepool,
)


def test_a_template_carries_the_device_plugins_figures_in_both_units() -> None:
    for unit, per_gpu in ((MemoryUnit.GiB, 16), (MemoryUnit.MiB128, 128)):
        node = gpu_template("g", GpuShape(gpus=4, gib=16, unit=unit), labels={"x": "y"})
        status = node["status"]
        assert status["allocatable"]["aliyun.com/gpu-mem"] == str(4 * per_gpu)
        assert status["capacity"]["aliyun.com/gpu-count"] == "4"
        gpus = json.loads(node["metadata"]["annotations"][ANN_NODE_GPUS])
        assert [g["memUnits"] for g in gpus] == [per_gpu] * 4
        assert node["metadata"]["annotations"][ANN_NODE_UNIT] == unit.value
        # every created node would carry the template's hostname: kubelet's part, not the group's
        assert HOSTNAME_LABEL not in node["metadata"]["labels"]
        assert node["metadata"]["labels"][GROUP_LABEL] == "g"
        assert node["metadata"]["labels"]["x"] == "y"
        assert [c["type"] for c in status["conditions"]] == ["Ready"]


def test_a_warm_node_is_made_as_the_kwok_provider_makes_one() -> None:
    node = node_of_group(gpu_template("g", GpuShape(gpus=1, gib=8)), "g-warm0")
    assert node["metadata"]["name"] == "g-warm0"
    assert node["spec"]["providerID"] == "kwok:g-warm0"
    assert node["metadata"]["annotations"][CA_GROUP_ANNOTATION] == "g"
    assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"


def test_the_stand_in_publishes_once_with_the_nodes_own_uuids() -> None:
    shape = GpuShape(gpus=2, gib=16, unit=MemoryUnit.MiB128)
    bare = {"metadata": {"name": "n1", "labels": {GROUP_LABEL: "g"}, "annotations": {}}}
    patch = node_agent_patch(bare, shape)["metadata"]
    assert patch["labels"][HOSTNAME_LABEL] == "n1"
    gpus = json.loads(patch["annotations"][ANN_NODE_GPUS])
    assert [g["uuid"] for g in gpus] == ["GPU-n1-0", "GPU-n1-1"]
    assert [g["memUnits"] for g in gpus] == [128, 128]
    assert patch["annotations"][ANN_NODE_UNIT] == "128MiB"
    done = {
        "metadata": {
            "name": "n1",
            "labels": {**bare["metadata"]["labels"], **patch["labels"]},
            "annotations": patch["annotations"],
        }
    }
    assert node_agent_patch(done, shape) == {}
    # a node without GPUs gets only its hostname
    assert node_agent_patch(bare, None) == {"metadata": {"labels": {HOSTNAME_LABEL: "n1"}}}


def test_karpenter_objects_name_the_gpu_resources_and_the_group() -> None:
    kind = gpu_instance_type("t", GpuShape(gpus=4, gib=16, unit=MemoryUnit.MiB128))
    assert kind["resources"]["aliyun.com/gpu-mem"] == "512"
    assert kind["resources"]["aliyun.com/gpu-count"] == "4"
    pool = nodepool("p", ["t"], labels={"x": "y"})
    labels = pool["spec"]["template"]["metadata"]["labels"]
    assert labels[GROUP_LABEL] == "p" and labels["x"] == "y"
    assert pool["spec"]["template"]["spec"]["requirements"][0]["values"] == ["t"]


def test_the_stand_in_lifts_only_the_startup_taint_it_is_told() -> None:
    shape = GpuShape(gpus=1, gib=16)
    key = "startup-taint.cluster-autoscaler.kubernetes.io/gpushare"
    other = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
    node = {
        "metadata": {"name": "n1", "labels": {HOSTNAME_LABEL: "n1"}, "annotations": {}},
        "spec": {"taints": [{"key": key, "effect": "NoSchedule"}, other]},
    }
    assert node_agent_patch(node, shape, clears_taint=key)["spec"] == {"taints": [other]}
    assert "spec" not in node_agent_patch(node, shape)
