"""Kubernetes manifests as simulator input: nodes, workloads, the memory -> milli rule, errors."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from gpushare.cli import main
from gpushare.core.model.hostresources import pod_requests
from gpushare.core.model.units import MemoryUnit
from gpushare.kube.objects import gpu_node
from gpushare.sim import cards
from gpushare.sim.kubeyaml import (
    Document,
    KubeYamlError,
    is_kubernetes_yaml,
    quantity,
    read_nodes,
    read_pods,
    read_workload,
)
from gpushare.sim.openb import TraceError, TraceNode

EXAMPLES = Path(__file__).resolve().parents[3] / "src" / "gpushare" / "examples"

CLUSTER = """\
apiVersion: v1
kind: Node
metadata:
  name: t4-0
  labels: {aliyun.accelerator/nvidia_name: Tesla-T4, ack.node.gpu.schedule: cgpu}
status:
  capacity: {cpu: "32", memory: 128Gi, nvidia.com/gpu: "2"}
  allocatable: {cpu: 31500m, memory: 120Gi, nvidia.com/gpu: "2"}
---
apiVersion: v1
kind: Node
metadata:
  name: a10-0
  labels: {nvidia.com/gpu.product: NVIDIA-A10}
status:
  allocatable: {cpu: "16", memory: 64Gi, aliyun.com/gpu-count: "1", aliyun.com/gpu-mem: "22"}
"""


def _cluster(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.yaml"
    shared = gpu_node("shared-0", gpus_units=(15, 15), model="Tesla T4")
    path.write_text(CLUSTER + "---\n" + yaml.safe_dump(shared))
    return path


def test_reads_nodes_from_labels_capacity_and_the_gpushare_annotation(tmp_path: Path) -> None:
    nodes = read_nodes(_cluster(tmp_path))
    assert nodes[0] == TraceNode("t4-0", 31500, 120 * 1024, 2, "Tesla-T4", 15109, "cgpu")
    assert nodes[1] == TraceNode("a10-0", 16000, 64 * 1024, 1, "NVIDIA-A10", 22 * 1024, "")
    assert nodes[2] == TraceNode("shared-0", 64000, 256 * 1024, 2, "Tesla T4", 15 * 1024, "share")


def test_seed_manifests_become_pods_with_the_documented_share(tmp_path: Path) -> None:
    nodes = read_nodes(_cluster(tmp_path), unit=MemoryUnit.MiB128)
    pods = {p.name.rsplit("-", 1)[0]: p for p in read_pods(EXAMPLES, nodes, unit=MemoryUnit.MiB128)}
    assert sorted(pods) == [
        "binpack",
        "cuda-sample",
        "gpu-share-sample",
        "tensorflow-mnist-share",
    ]
    # At this unit a10-0's capacity gpu-mem "22" is 22 x 128 MiB: the smallest card.
    sample = pods["gpu-share-sample"]  # gpu-mem: 3 units of 128 MiB
    assert (sample.num_gpu, sample.gpu_milli, sample.gpu_mem_mib) == (1, 137, 384)
    assert pods["binpack"].gpu_milli == 728  # 16 units: ceil(16000 / 22)
    cuda = pods["cuda-sample"]
    assert (cuda.gpu_milli, cuda.gpu_core_pct) == (91, 30)
    big = read_pods(EXAMPLES / "binpack-128mib.yaml", nodes[:1], unit=MemoryUnit.MiB128)
    assert big[0].gpu_milli == 136  # on the T4 alone: 118 units, ceil(16000 / 118)


def test_gib_unit_rule_whole_cards_and_whole_gpus(tmp_path: Path) -> None:
    nodes = read_nodes(_cluster(tmp_path))  # T4: 14 GiB units, A10: 22, shared-0: 15
    pods = read_pods(EXAMPLES / "GPUtest.yaml", nodes)
    assert [(p.gpu_milli, p.gpu_mem_mib) for p in pods] == [(215, 3 * 1024)]  # 3000/14
    manifest = tmp_path / "jobs.yaml"
    manifest.write_text(
        """\
kind: Job
metadata: {name: whole}
spec:
  parallelism: 5
  completions: 2
  template:
    spec:
      containers: [{name: c, resources: {limits: {nvidia.com/gpu: 2, cpu: "4", memory: 8Gi}}}]
---
kind: Deployment
metadata: {name: card}
spec:
  replicas: 3
  template:
    metadata: {labels: {aliyun.com/gpu-count: "2"}}
    spec:
      nodeSelector: {aliyun.accelerator/nvidia_name: Tesla-T4}
      initContainers: [{name: i, resources: {requests: {cpu: "8"}}}]
      containers:
      - {name: a, resources: {requests: {cpu: 500m}, limits: {aliyun.com/gpu-mem: 28}}}
---
kind: Service
metadata: {name: ignored}
---
kind: List
items:
- kind: Pod
  metadata: {name: plain}
  spec: {containers: [{name: c, resources: {requests: {memory: 1G}}}]}
"""
    )
    pods = read_pods(manifest, nodes)
    assert [p.name for p in pods] == ["whole-0", "whole-1", "card-0", "card-1", "card-2", "plain"]
    assert (pods[0].num_gpu, pods[0].gpu_milli, pods[0].cpu_milli, pods[0].memory_mib) == (
        2,
        1000,
        4000,
        8192,
    )
    card = pods[2]  # 14 GiB per GPU over 2 GPUs: all of a T4 (the only model allowed)
    assert (card.num_gpu, card.gpu_milli, card.gpu_spec, card.cpu_milli) == (
        2,
        1000,
        ("Tesla-T4",),
        8000,
    )
    assert (pods[5].num_gpu, pods[5].memory_mib) == (0, 954)


def test_pods_count_cpu_and_memory_as_the_extender_does(tmp_path: Path) -> None:
    """Sidecars, pod-level requests and overhead count as ``core.model.hostresources`` counts
    them."""
    nodes = read_nodes(_cluster(tmp_path))
    manifest = tmp_path / "pods.yaml"
    manifest.write_text(
        """\
kind: Pod
metadata: {name: sidecar}
spec:
  initContainers:
  - {name: s, restartPolicy: Always, resources: {requests: {cpu: "1", memory: 1Gi}}}
  - {name: i, resources: {requests: {cpu: "2"}}}
  containers: [{name: a, resources: {requests: {cpu: "2", memory: 2Gi}}}]
  overhead: {cpu: 250m, memory: 64Mi}
---
kind: Pod
metadata: {name: podlevel}
spec:
  resources: {requests: {cpu: "6", memory: 10Gi}}
  containers: [{name: a, resources: {requests: {cpu: "1", memory: 1Gi}}}]
"""
    )
    pods = {p.name: p for p in read_pods(manifest, nodes)}
    extender = {
        doc["metadata"]["name"]: pod_requests(doc)
        for doc in yaml.safe_load_all(manifest.read_text())
    }
    for name, pod in pods.items():
        assert pod.cpu_milli == extender[name].cpu_milli
        assert pod.memory_mib * 1024 * 1024 == extender[name].memory_bytes
    assert (pods["sidecar"].cpu_milli, pods["sidecar"].memory_mib) == (3250, 3 * 1024 + 64)
    assert (pods["podlevel"].cpu_milli, pods["podlevel"].memory_mib) == (6000, 10 * 1024)


def test_content_decides_the_reader_not_the_extension(tmp_path: Path) -> None:
    nodes_csv = tmp_path / "nodes.yaml"
    nodes_csv.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,T4\n")
    pods_yaml = tmp_path / "pods.txt"
    pods_yaml.write_text((EXAMPLES / "GPUtest.yaml").read_text())
    assert not is_kubernetes_yaml(nodes_csv) and is_kubernetes_yaml(pods_yaml)
    nodes, pods = read_workload(nodes_csv, pods_yaml)
    assert nodes[0].model == "T4" and pods[0].gpu_milli == 215  # T4 from the model table


def test_quantities_and_card_names() -> None:
    doc = Document("f.yaml", 1, {"kind": "Node"})
    assert quantity(doc, "cpu", "500m") == Decimal("0.5")
    assert quantity(doc, "memory", "2Gi") == 2 * 1024**3
    assert quantity(doc, "memory", "1e3") == 1000
    assert cards.memory_mib("Tesla-T4") == 15109
    assert cards.memory_mib("NVIDIA A10") == 22731
    assert cards.memory_mib("Tesla V100-SXM2-32GB") == 32510
    assert cards.memory_mib("Tesla P100-PCIE-16GB") == 16280
    assert cards.memory_mib("H100") is None


BAD = [
    (
        "kind: Node\nmetadata: {name: n}\nstatus: {capacity: {cpu: lots, memory: 1Gi}}\n",
        r"bad\.yaml document 1 \(Node n\): status\.allocatable\.cpu='lots' is not a Kubernetes "
        r"quantity; write e\.g\. 8",
    ),
    (
        "kind: Node\nmetadata: {name: n}\nstatus: {capacity: {memory: 1Gi}}\n",
        r"status\.allocatable\.cpu=None is missing; .* add it",
    ),
    (
        "kind: Node\nmetadata: {name: n, labels: {nvidia.com/gpu.product: H100}}\n"
        "status: {capacity: {cpu: 1, memory: 1Gi, nvidia.com/gpu: 1}}\n",
        r"nvidia_name'\]='H100' does not tell the card's memory; add capacity",
    ),
    ("kind: Node\nmetadata: {name: n\n", r"bad\.yaml: not valid YAML"),
    ("- 1\n", r"bad\.yaml document 1: \[1\] is not a Kubernetes object"),
    ("kind: Service\nmetadata: {name: s}\n", r"holds no kind: Node object"),
]


@pytest.mark.parametrize(("text", "message"), BAD)
def test_bad_nodes_name_file_document_field_value_and_fix(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(KubeYamlError, match=message):
        read_nodes(path)


BAD_PODS = [
    (
        "kind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, resources: "
        "{limits: {aliyun.com/gpu-mem: 1.5}}}]}\n",
        r"document 1 \(Pod p\): spec=.* the extender rejects: .*is fractional",
    ),
    (
        "kind: Job\nmetadata: {name: j}\nspec: {template: {spec: {containers: [{name: c, "
        "resources: {limits: {aliyun.com/gpu-mem: 40}}}]}}}\n",
        r"\(Job j\): spec\.template\.spec\.containers\[\*\]\.resources\.limits\["
        r"'aliyun\.com/gpu-mem'\]=40 \(40 GiB per GPU\) fits no card of the cluster; lower it",
    ),
    (
        "kind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, resources: "
        "{limits: {nvidia.com/gpu: 1, aliyun.com/gpu-mem: 2}}}]}\n",
        r"asks for whole GPUs and a GPU share at once",
    ),
    (
        "kind: Deployment\nmetadata: {name: d}\nspec: {replicas: -1, template: {spec: "
        "{containers: [{name: c}]}}}\n",
        r"\(Deployment d\): spec\.replicas=-1 must be a whole number >= 0",
    ),
    ("kind: Job\nmetadata: {name: j}\nspec: {}\n", r"spec\.template=None is missing"),
    ("kind: Pod\nmetadata: {name: p}\nspec: {}\n", r"spec\.containers=None must list"),
]


@pytest.mark.parametrize(("text", "message"), BAD_PODS)
def test_bad_pods_name_file_document_field_value_and_fix(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(KubeYamlError, match=message):
        read_pods(path, [TraceNode("n", 1000, 1024, 1, "T4")])


def test_cli_runs_manifests_and_exits_2_on_bad_ones(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path)
    out = tmp_path / "r"
    args = ["simulate", "--nodes", str(cluster), "--pods", str(EXAMPLES / "GPUtest.yaml")]
    result = CliRunner().invoke(
        main, [*args, "--seeds", "1", "--workers", "1", "--out", str(out), "--no-plots"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads((out / "report.json").read_text())["nodes"] == 3
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD_PODS[0][0])
    failed = CliRunner().invoke(main, ["simulate", "--nodes", str(cluster), "--pods", str(bad)])
    assert failed.exit_code == 2
    assert "error: bad.yaml document 1 (Pod p)" in failed.output
    assert issubclass(KubeYamlError, TraceError)
