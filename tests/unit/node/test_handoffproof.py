"""Whether the runtime applies the hand-off: the pure decision from what containerd and the
NVIDIA Container Toolkit report (issue 59, PLATFORMS.md C5/E3/A3/R3, gap 4).

Field names: containerd v2.2.9 ``internal/cri/config/config.go`` (``EnableCDI``
``json:"enableCDI"``, ``CDISpecDirs`` ``json:"cdiSpecDirs"``, in ``RuntimeConfig``, embedded in
the ``Config`` that ``internal/cri/server/status.go`` marshals into ``info["config"]``); 1.7.34
``pkg/cri/config/config.go`` (the same tags on ``PluginConfig``); the toolkit's default
``AcceptEnvvarUnprivileged: true`` (``api/config/v1/config.go``, ``GetDefault``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpushare.node.cdi import Strategy
from gpushare.node.handoffproof import (
    Mode,
    Proof,
    RuntimeAnswer,
    ToolkitAnswer,
    Verdict,
    on_host,
    prove_cdi,
    prove_envvar,
    refusal,
    skipped,
)

DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))
SPEC = ["/var/run/cdi/nvidia.yaml"]


def containerd(config: dict[str, object], version: str = "v2.2.9") -> RuntimeAnswer:
    return RuntimeAnswer(
        name="containerd", version=version, info={"config": json.dumps(config), "golang": '"x"'}
    )


def test_containerd_with_cdi_on_reading_the_spec_s_directory_applies_it() -> None:
    proof = prove_cdi(
        containerd({"enableCDI": True, "cdiSpecDirs": ["/etc/cdi", "/var/run/cdi"]}),
        spec_files=SPEC,
        spec_dirs=DIRS,
    )
    assert proof.verdict is Verdict.APPLIED
    assert proof.summary() == (
        "applied: containerd v2.2.9: enable_cdi = true, cdi_spec_dirs = /etc/cdi, /var/run/cdi"
    )


def test_var_run_and_run_are_one_directory() -> None:
    proof = prove_cdi(
        containerd({"enableCDI": True, "cdiSpecDirs": ["/run/cdi"]}),
        spec_files=SPEC,
        spec_dirs=DIRS,
    )
    assert proof.verdict is Verdict.APPLIED


def test_cdi_off_is_ignored_and_the_refusal_names_enable_cdi_and_the_envvar_way() -> None:
    proof = prove_cdi(
        containerd({"enableCDI": False, "cdiSpecDirs": ["/etc/cdi"]}, "v1.7.34"),
        spec_files=SPEC,
        spec_dirs=DIRS,
    )
    assert proof == Proof(Verdict.IGNORED, ("containerd v1.7.34 runs with enable_cdi = false",))
    words = refusal(proof, Strategy.CDI_CRI)
    assert words is not None
    for said in (
        "would start without their GPUs",
        "enable_cdi = true",
        "io.containerd.cri.v1.runtime",
        "io.containerd.grpc.v1.cri",
        "devicePlugin.deviceListStrategy=envvar",
        "devicePlugin.handOffCheck=warn",
    ):
        assert said in words


def test_containerd_1_6_has_no_cdi_at_all() -> None:
    proof = prove_cdi(
        containerd({"sandboxImage": "pause"}, "1.6.20~ds1"), spec_files=SPEC, spec_dirs=DIRS
    )
    assert proof.verdict is Verdict.IGNORED
    assert "no CDI support" in proof.reasons[0] and "1.6.20~ds1" in proof.reasons[0]


def test_a_spec_in_a_directory_the_runtime_does_not_read_is_ignored() -> None:
    proof = prove_cdi(
        containerd({"enableCDI": True, "cdiSpecDirs": ["/etc/cdi"]}),
        spec_files=SPEC,
        spec_dirs=DIRS,
    )
    assert proof.verdict is Verdict.IGNORED
    assert (
        "the plugin's CDI spec is in /var/run/cdi, which the runtime does not read"
        in (proof.reasons[0])
    )


def test_without_a_spec_the_configured_directories_are_compared() -> None:
    assert (
        prove_cdi(
            containerd({"enableCDI": True, "cdiSpecDirs": ["/etc/cdi"]}),
            spec_files=[],
            spec_dirs=DIRS,
        ).verdict
        is Verdict.APPLIED
    )
    assert (
        prove_cdi(
            containerd({"enableCDI": True, "cdiSpecDirs": ["/opt/cdi"]}),
            spec_files=[],
            spec_dirs=DIRS,
        ).verdict
        is Verdict.IGNORED
    )


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (
            RuntimeAnswer(unanswered="no CRI socket at /x (No such file or directory)"),
            "no CRI socket",
        ),
        (RuntimeAnswer(name="cri-o", version="1.33.0", info={}), "cri-o 1.33.0 reports no CDI"),
        (RuntimeAnswer(name="containerd", version="v2", info={}), "gave no CRI configuration"),
        (RuntimeAnswer(name="containerd", info={"config": "{not json"}), "no CRI configuration"),
    ],
)
def test_what_cannot_be_asked_is_unknown_never_refused(answer: RuntimeAnswer, why: str) -> None:
    proof = prove_cdi(answer, spec_files=SPEC, spec_dirs=DIRS)
    assert proof.verdict is Verdict.UNKNOWN
    assert proof.reasons[0].startswith("cannot tell: ") and why in proof.reasons[0]
    assert refusal(proof, Strategy.CDI_CRI) is None


def test_the_toolkit_default_accepts_the_variable() -> None:
    path = Path("/etc/nvidia-container-runtime/config.toml")
    proof = prove_envvar(ToolkitAnswer(path, text="disable-require = false\n"))
    assert proof.verdict is Verdict.APPLIED and "(the default)" in proof.reasons[0]
    given = prove_envvar(
        ToolkitAnswer(path, text="accept-nvidia-visible-devices-envvar-when-unprivileged = true\n")
    )
    assert given.verdict is Verdict.APPLIED and "default" not in given.reasons[0]


def test_the_toolkit_refusing_the_variable_in_unprivileged_containers_is_ignored() -> None:
    text = (
        "accept-nvidia-visible-devices-envvar-when-unprivileged = false\n[nvidia-container-cli]\n"
    )
    proof = prove_envvar(ToolkitAnswer(Path("/t/config.toml"), text=text))
    assert proof.verdict is Verdict.IGNORED
    words = refusal(proof, Strategy.ENVVAR)
    assert words is not None
    for said in ("devicePlugin.deviceListStrategy=cdi-cri", "devicePlugin.privileged=true"):
        assert said in words


def test_an_unread_or_broken_toolkit_config_is_unknown(tmp_path: Path) -> None:
    missing = prove_envvar(ToolkitAnswer.read(tmp_path / "config.toml"))
    assert missing.verdict is Verdict.UNKNOWN and "no such file here" in missing.reasons[0]
    broken = tmp_path / "broken.toml"
    broken.write_text("accept = [\n")
    assert prove_envvar(ToolkitAnswer.read(broken)).verdict is Verdict.UNKNOWN


def test_off_and_other_strategies_ask_nothing() -> None:
    assert skipped(Strategy.CDI_CRI, Mode.OFF) == Proof(Verdict.SKIPPED, ("--hand-off-check off",))
    assert skipped("driver-root", Mode.REFUSE) is not None
    assert skipped(Strategy.ENVVAR, Mode.WARN) is None


def test_spec_files_are_named_as_the_host_names_them() -> None:
    seen = (Path("/host/cdi/0"), Path("/host/cdi/1"))
    files = ["/host/cdi/1/nvidia.yaml", "/elsewhere/x.json"]
    assert on_host(files, seen, DIRS) == ["/var/run/cdi/nvidia.yaml", "/elsewhere/x.json"]
