"""``--log-format``: one format for a component's records and uvicorn's, with a time in each."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from gpushare.cli import main
from gpushare.cli.logs import setup_logging
from gpushare.extender.app import server_config

TEXT_TIME = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def emit_both(capsys: pytest.CaptureFixture[str], log_format: str) -> list[str]:
    """A gpushare record and uvicorn's own, once uvicorn configured itself as the extender does."""
    setup_logging("info", log_format)
    # uvicorn configures its loggers when its Config is made
    server_config(object(), host="127.0.0.1", port=0, log_level="info")
    logging.getLogger("gpushare.extender.service").info("node=%s pod=%s phase=bind", "n1", "a/b")
    logging.getLogger("uvicorn.error").info("Application startup complete.")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2, lines
    return lines


def test_json_lines_for_the_component_and_uvicorn(capsys: pytest.CaptureFixture[str]) -> None:
    ours, uvicorns = (json.loads(line) for line in emit_both(capsys, "json"))
    assert ours["level"] == "info" and ours["logger"] == "gpushare.extender.service"
    assert ours["message"] == "node=n1 pod=a/b phase=bind"
    assert (ours["node"], ours["pod"], ours["phase"]) == ("n1", "a/b", "bind")
    assert uvicorns["logger"] == "uvicorn.error"
    assert uvicorns["message"] == "Application startup complete."
    for record in (ours, uvicorns):
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", record["time"])


def test_text_lines_for_the_component_and_uvicorn_both_start_with_a_time(
    capsys: pytest.CaptureFixture[str],
) -> None:
    ours, uvicorns = emit_both(capsys, "text")
    assert TEXT_TIME.match(ours) and ours.endswith("node=n1 pod=a/b phase=bind")
    assert TEXT_TIME.match(uvicorns) and "INFO uvicorn.error Application startup" in uvicorns


def test_an_exception_is_one_json_line(capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("info", "json")
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("gpushare.x").exception("key=k phase=active report not applied")
    [line] = capsys.readouterr().err.splitlines()
    record = json.loads(line)
    assert record["key"] == "k" and "ValueError: boom" in record["exception"]


@pytest.mark.parametrize(("level", "shown"), [("info", 0), ("debug", 1)])
def test_the_http_clients_line_per_request_only_at_debug(
    capsys: pytest.CaptureFixture[str], level: str, shown: int
) -> None:
    setup_logging(level, "json")
    logging.getLogger("httpx2").info('HTTP Request: PATCH https://k/api/v1/nodes/n1 "200 OK"')
    logging.getLogger("httpx2").warning("a retry")
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert sum("HTTP Request" in line["message"] for line in lines) == shown
    assert any(line["message"] == "a retry" for line in lines)


@pytest.mark.parametrize("command", ["extender", "device-plugin", "webhook"])
def test_every_long_running_command_takes_log_format(command: str) -> None:
    shown = CliRunner().invoke(main, [command, "--help"]).output
    assert "--log-format [text|json]" in shown
    refused = CliRunner().invoke(main, [command, "--log-format", "xml"])
    assert refused.exit_code == 2 and "'xml' is not one of 'text', 'json'" in refused.output


def test_the_chart_passes_log_format_to_every_component() -> None:
    import yaml

    from tests.support.chart import HELM, helm, template_args

    if HELM is None:
        pytest.skip("helm not built")
    for wanted in ("text", "json"):
        rendered = helm(*template_args(), "--set", f"logFormat={wanted}").stdout
        args = {
            c["name"]: c.get("args", [])
            for d in yaml.safe_load_all(rendered)
            if d and d["kind"] in ("Deployment", "DaemonSet")
            for c in d["spec"]["template"]["spec"]["containers"]
        }
        for name in ("extender", "device-plugin", "webhook"):
            assert f"--log-format={wanted}" in args[name], (name, args[name])
