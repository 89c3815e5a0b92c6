"""Logging for the long-running commands (extender, device plugin, webhook): one setup for all.

Every component logs ``key=value`` records through the standard library; the commands that run
for long choose the level (``--log-level``) and the format (``--log-format``) here, so the
three components' logs read alike in ``kubectl logs``. uvicorn's own records (the extender and
the webhook serve HTTP with it) go through the same root handler: uvicorn is started with no
logging configuration of its own (``log_config=None`` in ``extender.app`` and
``webhook.app``), so its lines carry the same timestamp and, under ``json``, are JSON objects
too, instead of a second format without time.

``json`` writes one object a line: ``time`` (RFC 3339, UTC, milliseconds), ``level``,
``logger``, ``message`` (the text as ``text`` prints it), each ``key=value`` word of the message
as a field of its own (so a log store can filter on ``node`` or ``pod`` without parsing), and
``exception`` with the traceback when there is one.
"""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Any

import click

FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
FORMATS = ("text", "json")
_FIELD = re.compile(r"(?:^|\s)([a-z_][a-z0-9_]*)=(\S+)")
_RESERVED = frozenset({"time", "level", "logger", "message", "exception"})

LEVELS = ("debug", "info", "warning", "error")
"""The levels the chart's schema allows for ``logLevel``; any case is taken on the command line."""

log_level_option = click.option(
    "--log-level",
    type=click.Choice(LEVELS, case_sensitive=False),
    default="info",
    show_default=True,
    help="Log records at this level and above.",
)


log_format_option = click.option(
    "--log-format",
    type=click.Choice(FORMATS, case_sensitive=False),
    default="text",
    show_default=True,
    help="text: one line per record, time first; json: one JSON object per line, the "
    "message's key=value words as fields.",
)


class JsonFormatter(logging.Formatter):
    """One JSON object per record; see the module docstring for the fields."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": message,
        }
        for key, value in _FIELD.findall(message):
            if key not in _RESERVED:
                out.setdefault(key, value)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


HTTP_CLIENT_LOGGERS = ("httpx", "httpx2", "httpcore", "httpcore2")
"""Loggers of the HTTP client lightkube uses (both spellings of its packages)."""


def formatter(log_format: str) -> logging.Formatter:
    """The formatter of ``--log-format`` (``text`` or ``json``, any case)."""
    if log_format.lower() == "json":
        return JsonFormatter()
    if log_format.lower() == "text":
        return logging.Formatter(FORMAT)
    raise click.BadParameter(
        f"{log_format!r} is not a log format: use one of {', '.join(FORMATS)}",
        param_hint="--log-format",
    )


def setup_logging(level: str, log_format: str = "text") -> None:
    """Send records at ``level`` (a name such as ``info``, any case) and above to stderr.

    One handler on the root logger, replacing any: uvicorn's loggers, left unconfigured,
    propagate to it, so every line has one format. The HTTP client's line per request
    (``HTTP Request: PATCH ...``, at info) is kept for ``debug``: at info it would log every
    node and pod write and every watch re-opened, which the components log themselves where it
    matters.
    """
    handler = logging.StreamHandler()
    handler.setFormatter(formatter(log_format))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    quiet = logging.DEBUG if level.upper() == "DEBUG" else logging.WARNING
    for name in HTTP_CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(quiet)
