"""How a command says it cannot go on: click's exceptions, one of them ours.

Flags that do not parse or do not go together are click's ``BadParameter`` and ``UsageError``
(exit 2, with the usage line). Everything else a user can hit before a component runs (settings
the configuration refuses, a seal key file that cannot be read, an API server that cannot be
reached, a node the device plugin must not serve) is a :class:`CommandError`: exit 2 as well,
printed as ``error: ...`` on stderr without the usage line, since the flags were well formed
and the message says what to change. ``click.ClickException`` itself (exit 1) is left for what
the installation lacks (the simulator's extra).
"""

from __future__ import annotations

from typing import IO, Any

import click


class CommandError(click.ClickException):
    """The command cannot start or go on; the message names what was wrong and what to do."""

    exit_code = 2

    def show(self, file: IO[Any] | None = None) -> None:
        """Print ``error: <message>`` (on stderr unless ``file`` is given)."""
        click.echo(f"error: {self.format_message()}", file=file, err=file is None)
