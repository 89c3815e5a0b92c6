"""Logging for the long-running commands (extender, device plugin, webhook): one setup for all.

Every component logs ``key=value`` records through the standard library; the commands that run
for long choose the level (``--log-level``) and the one line format here, so the three
components' logs read alike in ``kubectl logs``.
"""

from __future__ import annotations

import logging

import click

FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"

LEVELS = ("debug", "info", "warning", "error")
"""The levels the chart's schema allows for ``logLevel``; any case is taken on the command line."""

log_level_option = click.option(
    "--log-level",
    type=click.Choice(LEVELS, case_sensitive=False),
    default="info",
    show_default=True,
    help="Log records at this level and above.",
)


def setup_logging(level: str) -> None:
    """Send records at ``level`` (a name such as ``info``, any case) and above to stderr."""
    logging.basicConfig(level=level.upper(), format=FORMAT)
