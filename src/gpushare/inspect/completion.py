"""Shell completion for ``kubectl inspect cgpu``, through click and through kubectl.

Two ways in. Run as ``kubectl-inspect-cgpu``, click's own completion answers
(``_KUBECTL_INSPECT_CGPU_COMPLETE=bash_source kubectl-inspect-cgpu``, or zsh_source,
fish_source). Run as ``kubectl inspect cgpu``, kubectl (1.26 and later) completes the words
after the plugin's name by running ``kubectl_complete-inspect-cgpu`` with them, the last one
being the word to complete (empty for a new word), and reads one choice a line, then a last
line ``:N`` with cobra's directive (4: offer no file names). kubectl builds that name from the
command path, ``kubectl inspect cgpu``: dashes of a word become underscores, spaces become
dashes, and ``_complete`` goes before the first dash (``pluginCompletion`` and
``lookupCompletionExec`` in kubectl's ``pkg/cmd/plugin_completion.go``), so a plugin whose file
is ``kubectl-inspect-cgpu`` is completed by ``kubectl_complete-inspect-cgpu``. Both ways use
the same option definitions, so they offer the same choices (``choices``).
"""

from __future__ import annotations

import sys

from click.shell_completion import ShellComplete

from gpushare.inspect.cli import main as command

PROG = "kubectl-inspect-cgpu"
COMPLETE_VAR = "_KUBECTL_INSPECT_CGPU_COMPLETE"
NO_FILES = 4
"""cobra's ShellCompDirectiveNoFileComp."""
FILES = 0
"""cobra's ShellCompDirectiveDefault: the shell offers file names."""


def plugin_completions(args: list[str]) -> list[str]:
    """The lines ``kubectl_complete-inspect-cgpu ARGS`` prints: choices, then ``:directive``."""
    words, incomplete = (args[:-1], args[-1]) if args else ([], "")
    completer = ShellComplete(command, {}, PROG, COMPLETE_VAR)
    items = completer.get_completions(words, incomplete)
    if any(item.type in ("file", "dir") for item in items):
        return [f":{FILES}"]
    lines = [f"{item.value}\t{item.help}" if item.help else str(item.value) for item in items]
    return [*lines, f":{NO_FILES}"]


def main() -> None:
    """``kubectl_complete-inspect-cgpu``: kubectl's plugin completion protocol."""
    for line in plugin_completions(sys.argv[1:]):
        print(line)
