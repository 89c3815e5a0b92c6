"""The command-line tools: kubectl-inspect-cgpu, gpushare demo and scheduler-config."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from click.testing import CliRunner

from gpushare.cli import main as gpushare
from gpushare.core.trust import SealKey, Trust
from gpushare.inspect.cli import collect, find_trust, render
from gpushare.inspect.cli import main as inspect_cgpu
from gpushare.kube.memory import MemoryKube
from gpushare.kube.objects import gpu_node

KUBECONFIG = """apiVersion: v1
kind: Config
clusters:
- name: nowhere
  cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}
users:
- name: nobody
  user: {token: abc}
contexts:
- name: nowhere
  context: {cluster: nowhere, user: nobody}
current-context: nowhere
"""


def test_inspect_says_clearly_when_no_cluster_is_reachable(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(KUBECONFIG)
    result = CliRunner().invoke(inspect_cgpu, ["--kubeconfig", str(config)])
    assert result.exit_code == 1
    assert "error: cannot read from the Kubernetes API at https://127.0.0.1:1" in result.output
    assert "hint:" in result.output


def test_inspect_reports_a_missing_kubeconfig(tmp_path: Path) -> None:
    result = CliRunner().invoke(inspect_cgpu, ["--kubeconfig", str(tmp_path / "absent")])
    assert result.exit_code == 1 and "cannot load a kubeconfig" in result.output


def test_inspect_reports_an_unknown_context(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(KUBECONFIG)
    result = CliRunner().invoke(inspect_cgpu, ["--kubeconfig", str(config), "--context", "prod"])
    assert result.exit_code == 1 and "prod" in result.output


def test_inspect_through_the_port_renders_text_and_json() -> None:
    kube = MemoryKube()
    kube.put_node(gpu_node("n1", ip="10.0.0.1", gpus_units=[15, 15]))
    view = asyncio.run(collect(kube))
    assert "0/30 (0%)" in render(view, details=False, output="text")
    assert json.loads(render(view, details=True, output="json"))["cluster"]["totalMiB"] == 30720


def test_demo_prints_the_seed_walkthrough() -> None:
    result = CliRunner().invoke(gpushare, ["demo"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "GPU0(Allocated/Total)" in out and "GPU Memory(GiB)" in out
    assert "0/15 (0%)" in out
    assert "cn-zhangjiakou.192.168.66.139  192.168.66.139  3/15" in out
    assert "3/15 (20%)" in out
    assert "aliyun.com/gpu-core.percentage: '400'" in out
    assert "Core :       30/400% (7%)" in out
    assert "GPU0: 15 GiB total < 16 GiB requested" in out
    assert "GPU0: 12/15 GiB free < 13 GiB requested" in out
    assert "has a unit suffix" in out and "is not a multiple of 5" in out
    assert "does not divide evenly" in out


def test_scheduler_config_command_prints_yaml() -> None:
    result = CliRunner().invoke(gpushare, ["scheduler-config", "--url", "http://127.0.0.1:9999"])
    assert result.exit_code == 0 and "urlPrefix: http://127.0.0.1:9999" in result.output


def test_extender_rejects_bad_settings_before_starting() -> None:
    result = CliRunner().invoke(gpushare, ["extender", "--gpu-memory-unit", "2GiB"])
    assert result.exit_code == 2
    assert "gpu_memory_unit='2GiB'" in result.output


def test_inspect_reads_the_key_from_the_secret_or_says_it_checks_structure_only() -> None:
    kube = MemoryKube()
    trust, note = asyncio.run(find_trust(kube))
    assert trust == Trust.sealed(SealKey(kube.seal_key)) and note == ""
    trust, note = asyncio.run(find_trust(kube, secret="elsewhere/none"))
    assert trust == Trust.structural()
    assert note == (
        "note: cannot read Secret elsewhere/none: secret elsewhere/none not found; checking "
        "allocations' structure only (node and requests), not their seals (give "
        "--seal-key-file or --seal-secret)"
    )


def test_inspect_refuses_a_bad_seal_secret_or_key_file(tmp_path: Path) -> None:
    bad = CliRunner().invoke(inspect_cgpu, ["--seal-secret", "no-slash"])
    assert bad.exit_code == 2 and "write NAMESPACE/NAME" in bad.output
    config = tmp_path / "kubeconfig"
    config.write_text(KUBECONFIG)
    absent = CliRunner().invoke(
        inspect_cgpu, ["--kubeconfig", str(config), "--seal-key-file", str(tmp_path / "none")]
    )
    assert absent.exit_code == 2 and "cannot read the seal key file" in absent.output
