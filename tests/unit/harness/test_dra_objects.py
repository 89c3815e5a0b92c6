"""DRA mode's objects as harness.dra writes them for the e2e tests: a DRA group's template, the
slice published for a kwok node, and the claim template and pod in docs/dra.md's shape."""

from __future__ import annotations

from gpushare.core.dra.slices import gpus_from_slice, slice_name
from gpushare.core.model.names import (
    DRA_CLAIM_NAME,
    DRA_DEVICE_CLASS,
    DRA_DRIVER,
    LABEL_ALLOCATION_MODE,
)
from gpushare.core.model.units import MemoryUnit
from harness.autoscalers import GROUP_LABEL, GpuShape, dra_template, node_of_group
from harness.dra import allocated_devices, claim_template, device_class, dra_pod, node_slice


def test_a_dra_template_is_labelled_for_dra_and_has_no_ack_resources() -> None:
    node = dra_template("g", labels={"x": "y"}, min_count=1)
    labels = node["metadata"]["labels"]
    assert labels[LABEL_ALLOCATION_MODE] == "dra"
    assert labels[GROUP_LABEL] == "g" and labels["x"] == "y"
    assert not [r for r in node["status"]["allocatable"] if r.startswith("aliyun.com/")]
    assert node["metadata"]["annotations"]["cluster-autoscaler.kwok.nodegroup/min-count"] == "1"


def test_a_nodes_slice_is_the_drivers_owned_by_the_node_and_reads_back() -> None:
    for unit in (MemoryUnit.GiB, MemoryUnit.MiB128):
        shape = GpuShape(gpus=4, gib=16, unit=unit)
        node = node_of_group(dra_template("g"), "g-abcde")
        node["metadata"]["uid"] = "u-1"
        obj = node_slice(node, shape)
        assert obj["metadata"]["name"] == slice_name("g-abcde")
        (owner,) = obj["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("Node", "g-abcde", "u-1")
        spec = gpus_from_slice(obj)
        assert spec is not None and spec.node == "g-abcde" and spec.unit == unit
        assert [g.mem_units for g in spec.gpus] == [shape.units_per_gpu] * 4
        assert [g.uuid for g in spec.gpus] == [g.uuid for g in shape.inventory("g-abcde")]


def test_the_claim_template_and_pod_have_docs_dra_shape() -> None:
    template = claim_template("gpushare-13gi", "ns", {"main": 13})
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["name"] == "main"
    assert request["exactly"] == {
        "deviceClassName": DRA_DEVICE_CLASS,
        "allocationMode": "ExactCount",
        "count": 1,
        "capacity": {"requests": {"memory": "13Gi"}},
    }
    pod = dra_pod("p", "ns", "gpushare-13gi", selector={"a": "b"})
    assert pod["spec"]["resourceClaims"] == [
        {"name": DRA_CLAIM_NAME, "resourceClaimTemplateName": "gpushare-13gi"}
    ]
    (container,) = pod["spec"]["containers"]
    assert container["resources"] == {"claims": [{"name": DRA_CLAIM_NAME, "request": "main"}]}
    assert "schedulingGates" not in pod["spec"]  # the stock allocator places it
    expression = device_class()["spec"]["selectors"][0]["cel"]["expression"]
    assert expression == f'device.driver == "{DRA_DRIVER}"'


def test_allocated_devices_reads_the_results() -> None:
    claim = {
        "status": {
            "allocation": {
                "devices": {"results": [{"pool": "n1", "device": "gpu-2", "driver": DRA_DRIVER}]}
            }
        }
    }
    assert allocated_devices(claim) == [("n1", "gpu-2")]
    assert allocated_devices({}) == []
