"""The command-line tools: kubectl-inspect-cgpu, gpushare demo, scheduler-config, seal-key."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from gpushare.cli import main as gpushare
from gpushare.core.model.names import ANN_NODE_GPUS, ANN_NODE_UNIT
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.trust import SealKey, Trust
from gpushare.inspect.cli import collect, find_trust, installed_seal_secret, render
from gpushare.inspect.cli import main as inspect_cgpu
from gpushare.inspect.installed import seal_secret
from gpushare.kube.memory import MemoryKube
from gpushare.kube.objects import gpu_node
from gpushare.kube.sealing import DEFAULT_SECRET, load_key_file
from tests.support.chart import CHART, HELM, KUBE_VERSION, find, helm
from tests.support.kubeconfigs import KUBECONFIG


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
    assert json.loads(render(view, details=True, output="json"))["cluster"]["totalMib"] == 30720


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


def test_demo_prints_only_what_a_cluster_prints() -> None:
    out = CliRunner().invoke(gpushare, ["demo"]).output
    lines = out.splitlines()
    # events as kubectl lists them: gpushare's own, then kube-scheduler's in its v1.36 wording
    scheduled = [line for line in lines if line.startswith("Normal   Scheduled ")]
    assert scheduled and all(
        line.rstrip().endswith(".139") or line.rstrip().endswith(".140") for line in scheduled
    )  # no "(GPU 0)" added to kube-scheduler's
    assert any(
        line.startswith("Normal   GPUShareScheduled   gpushare-extender   GPU0 on ")
        for line in lines
    )
    failed = [line for line in lines if line.startswith("Warning   FailedScheduling ")]
    assert len(failed) == 2
    assert all(
        ". no new claims to deallocate, preemption: 0/2 nodes are available: " in line
        for line in failed
    )
    assert any(
        line.startswith("Warning   GPUShareUnschedulable   gpushare-extender   0/2 nodes kube-")
        for line in lines
    )
    # requests the webhook refuses never become pods: kubectl apply says why
    denied = [line for line in lines if 'admission webhook "validate.gpushare.io" denied' in line]
    assert len(denied) == 3 and all(line.startswith("The request is invalid: ") for line in denied)
    assert "pod/suffixed created" not in out and "describe pod suffixed" not in out
    # nothing a cluster does not print: no per-node reason lines under an event
    assert not [line for line in lines if line.startswith("    cn-zhangjiakou.")]


def test_scheduler_config_command_prints_yaml() -> None:
    result = CliRunner().invoke(gpushare, ["scheduler-config", "--url", "http://127.0.0.1:9999"])
    assert result.exit_code == 0 and "urlPrefix: http://127.0.0.1:9999" in result.output
    assert "percentageOfNodesToScore: 100" in result.output


def test_scheduler_config_takes_the_gpu_profiles_percentage_of_nodes_to_score() -> None:
    flag = "--percentage-of-nodes-to-score"
    result = CliRunner().invoke(gpushare, ["scheduler-config", flag, "20"])
    config = yaml.safe_load(result.output)
    assert [p.get("percentageOfNodesToScore") for p in config["profiles"]] == [None, 20]
    refused = CliRunner().invoke(gpushare, ["scheduler-config", flag, "150"])
    assert refused.exit_code == 2
    assert "'--percentage-of-nodes-to-score'" in refused.output and "150" in refused.output


def test_extender_rejects_bad_settings_before_starting() -> None:
    result = CliRunner().invoke(gpushare, ["extender", "--gpu-memory-unit", "2GiB"])
    assert result.exit_code == 2
    assert "gpu_memory_unit='2GiB'" in result.output


def test_every_component_refuses_the_same_bad_setting_with_the_same_message(
    tmp_path: Path,
) -> None:
    """The extender, the webhook and the device plugin read settings through gpushare.config."""
    absent = str(tmp_path / "absent")
    commands = [
        ["extender"],
        ["webhook", "--tls-cert-file", absent, "--tls-private-key-file", absent],
        [
            "device-plugin",
            "--node-name=n",
            "--insecure-no-seal",
            f"--kubelet-config={absent}",
            f"--cpu-manager-state={absent}",
        ],
    ]
    for argv in commands:
        result = CliRunner().invoke(gpushare, [*argv, "--gpu-memory-unit", "2GiB"])
        assert result.exit_code == 2, result.output
        assert "error: gpu_memory_unit='2GiB': gpuMemoryUnit='2GiB' is not supported" in (
            result.output
        )


def test_the_long_running_commands_refuse_an_unknown_log_level_by_name() -> None:
    for command in ("extender", "webhook", "device-plugin"):
        result = CliRunner().invoke(gpushare, [command, "--log-level", "loud"])
        assert result.exit_code == 2, result.output
        assert "Invalid value for '--log-level': 'loud' is not one of" in result.output
        assert "'debug', 'info', 'warning', 'error'" in result.output
        assert result.exception is None or isinstance(result.exception, SystemExit)


def test_extender_and_device_plugin_refuse_to_start_without_a_seal_key() -> None:
    for argv in (["extender"], ["device-plugin", "--node-name", "n"]):
        result = CliRunner().invoke(gpushare, argv)
        assert result.exit_code == 2, result.output
        assert "no --seal-key-file given" in result.output
        assert "gpushare seal-key > seal.key" in result.output
        assert "head -c32 /dev/urandom" in result.output


def test_an_unreadable_or_short_seal_key_file_is_refused(tmp_path: Path) -> None:
    short = tmp_path / "short.key"
    short.write_text("tiny\n")
    for path, words in ((tmp_path / "absent", "cannot read the seal key file"), (short, "4 byte")):
        result = CliRunner().invoke(gpushare, ["extender", "--seal-key-file", str(path)])
        assert result.exit_code == 2 and words in result.output, result.output


def test_insecure_no_seal_warns_and_is_exclusive_with_a_key(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        gpushare, ["extender", "--insecure-no-seal", "--kubeconfig", str(tmp_path / "absent")]
    )
    assert "warning: --insecure-no-seal" in result.output
    assert "cannot load a kubeconfig" in result.output  # it went on to start
    both = CliRunner().invoke(
        gpushare, ["extender", "--insecure-no-seal", "--seal-key-file", str(tmp_path / "k")]
    )
    assert both.exit_code == 2 and "not both" in both.output


def test_seal_key_prints_a_key_the_components_accept(tmp_path: Path) -> None:
    result = CliRunner().invoke(gpushare, ["seal-key"])
    assert result.exit_code == 0
    path = tmp_path / "seal.key"
    path.write_text(result.output)
    assert len(load_key_file(path).secret) == 43
    assert CliRunner().invoke(gpushare, ["seal-key"]).output != result.output


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


def test_inspect_finds_the_seal_secret_of_any_release_through_the_extender_deployment() -> None:
    """The chart's Secret is <release>-seal in the release namespace: a release named other
    than gpushare was checked against gpushare/gpushare-seal (absent) and fell back to the
    structure alone, unless --seal-secret was given. Now the Secret is read off the extender
    Deployment's seal volume; the old default stays when that cannot be read."""
    if HELM is None:
        pytest.skip("helm not built")
    rendered = helm(
        "template", "team-a", str(CHART), "-n", "gpu-system", "--kube-version", KUBE_VERSION
    ).stdout
    deployment = find([d for d in yaml.safe_load_all(rendered) if d], "Deployment", "-scheduler")
    assert seal_secret([deployment], "gpu-system") == "gpu-system/team-a-gpushare-seal"
    kube = MemoryKube()
    kube.put_deployment(deployment)
    assert asyncio.run(installed_seal_secret(kube, "gpu-system")) == (
        "gpu-system/team-a-gpushare-seal"
    )
    assert asyncio.run(installed_seal_secret(kube, "elsewhere")) == DEFAULT_SECRET
    kube.forbidden.add("list_deployments:gpu-system")
    assert asyncio.run(installed_seal_secret(kube, "gpu-system")) == DEFAULT_SECRET


def test_inspect_refuses_a_bad_seal_secret_or_key_file(tmp_path: Path) -> None:
    bad = CliRunner().invoke(inspect_cgpu, ["--seal-secret", "no-slash"])
    assert bad.exit_code == 2 and "write NAMESPACE/NAME" in bad.output
    config = tmp_path / "kubeconfig"
    config.write_text(KUBECONFIG)
    absent = CliRunner().invoke(
        inspect_cgpu, ["--kubeconfig", str(config), "--seal-key-file", str(tmp_path / "none")]
    )
    assert absent.exit_code == 2 and "cannot read the seal key file" in absent.output


def test_inspect_finds_the_unit_the_nodes_declare() -> None:
    kube = MemoryKube()
    kube.put_node(gpu_node("m1", ip="10.0.0.1", gpus_units=[120], unit=MemoryUnit.MiB128))
    bare = gpu_node("m2", ip="10.0.0.2", gpus_units=[120])
    del bare["metadata"]["annotations"][ANN_NODE_UNIT]  # capacity only: read in the declared unit
    del bare["metadata"]["annotations"][ANN_NODE_GPUS]
    kube.put_node(bare)
    notes: list[str] = []
    view = asyncio.run(collect(kube, notes=notes))
    assert view.unit == "128MiB" and notes == []
    assert [n.unit for n in view.nodes] == ["128MiB", "128MiB"]
    text = render(view, details=False, output="text")
    assert "GPU Memory(MiB)" in text and "0/15360" in text
    forced = asyncio.run(collect(kube, unit=MemoryUnit.GiB))
    assert [n.unit for n in forced.nodes] == ["128MiB", "1GiB"]


def test_inspect_notes_nodes_that_declare_different_units() -> None:
    kube = MemoryKube()
    kube.put_node(gpu_node("g1", gpus_units=[15]))
    kube.put_node(gpu_node("m1", gpus_units=[120], unit=MemoryUnit.MiB128))
    notes: list[str] = []
    view = asyncio.run(collect(kube, notes=notes))
    assert view.unit == "1GiB"
    assert notes == [
        "note: nodes declare different gpushare.io/gpu-mem-unit (1GiB: g1; 128MiB: m1); nodes "
        "without it are read in 1GiB: give --unit to choose, and set gpuMemoryUnit the same "
        "everywhere"
    ]


def test_inspect_names_nodes_with_gpu_memory_but_no_mode_label() -> None:
    kube = MemoryKube()
    kube.put_node(gpu_node("shared", ip="10.0.0.1", gpus_units=[15]))
    kube.put_node(gpu_node("plain", ip="10.0.0.2", gpus_units=[15, 15], mode=None))
    kube.put_node(gpu_node("odd", ip="10.0.0.3", gpus_units=[15], mode="exclusive"))
    view = asyncio.run(collect(kube))
    assert view.unlabelled == ("odd", "plain")
    text = render(view, details=False, output="text")
    assert "Note: node(s) odd, plain have GPU memory but no ack.node.gpu.schedule label" in text
    assert "  kubectl label node odd ack.node.gpu.schedule=share   # or cgpu, core_mem, mps" in text
    assert "Note:" in render(view, details=True, output="text")
    data = json.loads(render(view, details=False, output="json"))
    assert data["unlabelledNodes"] == ["odd", "plain"]
    alone = MemoryKube()
    alone.put_node(gpu_node("shared", ip="10.0.0.1", gpus_units=[15]))
    assert "Note:" not in render(asyncio.run(collect(alone)), details=False, output="text")


def test_simulate_without_the_sim_extra_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The image installs no extra: `gpushare simulate` there names the extra, not a traceback."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "numpy" else real(name, *a)
    )
    result = CliRunner().invoke(gpushare, ["simulate"])
    assert result.exit_code == 1
    assert "needs numpy" in result.output
    assert "gpushare[sim]" in result.output
