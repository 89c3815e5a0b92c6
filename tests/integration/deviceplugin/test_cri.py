"""The hand-off check's CRI adapter against a CRI server on a unix socket, and the start it gates.

The server answers as containerd does (``Version``'s ``runtime_name``; verbose ``Status`` with
its CRI configuration as JSON under ``info["config"]``, containerd v2.2.9
``internal/cri/server/status.go``), so ``ask_runtime`` and ``gpushare device-plugin``'s check
(``cli.deviceplugin.prove_hand_off``) run as they do on a node.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpushare.cli.deviceplugin import device_plugin, prove_hand_off
from gpushare.cli.errors import CommandError
from gpushare.cli.pluginoptions import PluginOptions
from gpushare.deviceplugin.kubelet.cri import ask_runtime
from gpushare.deviceplugin.kubelet.protos.cri_v1 import api_pb2 as cri
from gpushare.deviceplugin.kubelet.protos.cri_v1 import api_pb2_grpc as cri_grpc
from gpushare.node.handoffproof import Verdict


class Containerd(cri_grpc.RuntimeServiceServicer):
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.verbose: list[bool] = []

    def Version(self, request: Any, context: Any) -> Any:
        return cri.VersionResponse(
            version="0.1.0", runtime_name="containerd", runtime_version="v2.2.9"
        )

    def Status(self, request: Any, context: Any) -> Any:
        self.verbose.append(request.verbose)
        info = {"config": json.dumps(self.config)} if request.verbose else {}
        return cri.StatusResponse(info=info)


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    # unix socket paths are short (108 bytes): not under pytest's long tmp_path
    with tempfile.TemporaryDirectory(prefix="cri") as name:
        yield Path(name)


def serve(sock: Path, servicer: Containerd) -> grpc.Server:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    cri_grpc.add_RuntimeServiceServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    return server


def test_the_adapter_asks_verbosely_and_hands_the_config_on(socket_dir: Path) -> None:
    sock = socket_dir / "containerd.sock"
    runtime = Containerd({"enableCDI": False, "cdiSpecDirs": ["/etc/cdi"]})
    server = serve(sock, runtime)
    try:
        answer = ask_runtime(sock)
    finally:
        server.stop(None)
    assert runtime.verbose == [True]
    assert (answer.name, answer.version, answer.unanswered) == ("containerd", "v2.2.9", "")
    assert answer.info is not None and json.loads(answer.info["config"])["enableCDI"] is False


def test_no_socket_and_a_socket_nobody_answers_are_said_in_words(socket_dir: Path) -> None:
    missing = ask_runtime(socket_dir / "absent.sock")
    assert missing.info is None and "no CRI socket at" in missing.unanswered
    assert "devicePlugin.criSocketPath" in missing.unanswered
    plain = socket_dir / "file"
    plain.write_text("")
    assert ask_runtime(plain).unanswered == f"{plain} is not a socket"


def options(*args: str) -> PluginOptions:
    ctx = device_plugin.make_context("device-plugin", ["--node-name=n", *args])
    return PluginOptions.from_flags(ctx.params)


def spec_dir(root: Path) -> Path:
    specs = root / "cdi"
    specs.mkdir()
    (specs / "nvidia.yaml").write_text(
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: [{name: GPU-1, containerEdits: {}}]\n"
    )
    return specs


def test_cdi_off_refuses_the_start_warn_starts_and_off_asks_nothing(
    socket_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sock = socket_dir / "containerd.sock"
    specs = spec_dir(socket_dir)
    runtime = Containerd({"enableCDI": False, "cdiSpecDirs": [str(specs)]})
    server = serve(sock, runtime)
    flags = ("--cri-socket", str(sock), "--cdi-spec-dirs", str(specs))
    try:
        with pytest.raises(CommandError, match=r"containerd v2\.2\.9 runs with enable_cdi = false"):
            prove_hand_off(options(*flags))
        with caplog.at_level(logging.WARNING):
            warned = prove_hand_off(options(*flags, "--hand-off-check", "warn"))
        assert warned.verdict is Verdict.IGNORED
        assert "--hand-off-check warn: device-list strategy cdi-cri" in caplog.text
        asked = len(runtime.verbose)
        assert prove_hand_off(options(*flags, "--hand-off-check", "off")).verdict is Verdict.SKIPPED
        assert len(runtime.verbose) == asked
        runtime.config = {"enableCDI": True, "cdiSpecDirs": ["/etc/cdi", "/var/run/cdi"]}
        on_host = ("--cdi-spec-host-dirs", "/var/run/cdi")
        assert prove_hand_off(options(*flags, *on_host)).verdict is Verdict.APPLIED
    finally:
        server.stop(None)


def test_a_runtime_that_cannot_be_asked_starts_with_cannot_tell_logged(
    socket_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO):
        proof = prove_hand_off(options("--cri-socket", str(socket_dir / "none.sock")))
    assert proof.verdict is Verdict.UNKNOWN
    assert "phase=hand-off-check unknown: cannot tell: no CRI socket at" in caplog.text


def test_envvar_reads_the_toolkit_config(socket_dir: Path) -> None:
    config = socket_dir / "config.toml"
    config.write_text("accept-nvidia-visible-devices-envvar-when-unprivileged = false\n")
    flags = ("--device-list-strategy", "envvar", "--toolkit-config", str(config))
    with pytest.raises(CommandError, match="ignores NVIDIA_VISIBLE_DEVICES in unprivileged"):
        prove_hand_off(options(*flags))


def test_host_dirs_must_match_the_spec_dirs_one_for_one() -> None:
    import click

    with pytest.raises(click.BadParameter, match="one host path per spec directory"):
        options("--cdi-spec-host-dirs", "/a")
