"""Completion of ``kubectl inspect cgpu``: kubectl's plugin protocol and click's own."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpushare.inspect.cli import main as inspect_cgpu
from gpushare.inspect.completion import plugin_completions

KUBECONFIG = """apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:1"}
users:
- name: u
  user: {token: abc}
contexts:
- name: prod
  context: {cluster: c, user: u, namespace: team-a}
- name: lab
  context: {cluster: c, user: u}
current-context: prod
"""
KUBECTL = Path.home() / ".cache/gpushare/bin/kubernetes-v1.36.3/kubectl"


def test_options_and_their_values(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "config"
    config.write_text(KUBECONFIG)
    monkeypatch.setenv("KUBECONFIG", str(config))
    assert plugin_completions(["-o", ""]) == ["text", "wide", "json", "yaml", ":4"]
    assert plugin_completions(["--context", ""]) == ["lab", "prod", ":4"]
    assert plugin_completions(["-n", "t"]) == ["team-a", ":4"]
    assert plugin_completions(["--kubeconfig", ""]) == [":0"]  # the shell offers files
    flags = plugin_completions(["--no"])
    assert flags[0].startswith("--no-headers\t") and flags[-1] == ":4"


def test_the_explained_pod_offers_nothing_when_the_cluster_cannot_be_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "config"
    config.write_text(KUBECONFIG)
    monkeypatch.setenv("KUBECONFIG", str(config))
    assert plugin_completions(["-e", ""]) == [":4"]


def test_click_completion_script_for_the_plugin() -> None:
    env = {"_KUBECTL_INSPECT_CGPU_COMPLETE": "bash_source"}
    result = CliRunner().invoke(inspect_cgpu, [], prog_name="kubectl-inspect-cgpu", env=env)
    assert "_kubectl_inspect_cgpu_completion" in result.output


@pytest.mark.skipif(not KUBECTL.exists(), reason="kubectl is not built (make controlplane)")
def test_kubectl_finds_the_completion_executable_by_its_name(tmp_path: Path) -> None:
    """kubectl's own completion runs ``kubectl_complete-inspect-cgpu`` for ``inspect cgpu``."""
    source = os.pathsep.join(p for p in sys.path if p)
    for name, module in [
        ("kubectl-inspect-cgpu", "gpushare.inspect.cli"),
        ("kubectl_complete-inspect-cgpu", "gpushare.inspect.completion"),
    ]:
        script = tmp_path / name
        script.write_text(
            f'#!/bin/sh\nPYTHONPATH="{source}" exec "{sys.executable}" -c '
            f'"from {module} import main; main()" "$@"\n'
        )
        script.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    env.pop("KUBECONFIG", None)
    result = subprocess.run(
        [str(KUBECTL), "__complete", "inspect", "cgpu", "-o", ""],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    assert result.stdout.splitlines() == ["text", "wide", "json", "yaml", ":4"], result.stderr
    assert shutil.which("kubectl_complete-inspect-cgpu", path=env["PATH"])
