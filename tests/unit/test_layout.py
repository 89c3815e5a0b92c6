"""docs/architecture.md's layout of the core says what the folders hold, in the contract's order.

The core is in subpackages, one a concept, layered by an import contract of its own
(``pyproject.toml``). The layout map lists each subpackage with every module in it; this test
reads the map and the folders, so a module added, moved or removed without the map failing
here, and a map whose order is not the contract's floors, top first, fails too.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "src" / "gpushare" / "core"
ENTRY = re.compile(r"^src/gpushare/core/(\w+)/\s+(.*)$")
CONTINUED = re.compile(r"^\s{20,}(\S.*)$")


def documented() -> dict[str, set[str]]:
    """Subpackage -> the module names the layout map lists for it, in the map's order."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    found: dict[str, str] = {}
    current = ""
    for line in block.splitlines():
        entry = ENTRY.match(line)
        if entry:
            current = entry.group(1)
            found[current] = entry.group(2)
        elif current and (more := CONTINUED.match(line)):
            found[current] += " " + more.group(1)
        else:
            current = ""
    names = {}
    for package, words in found.items():
        plain = re.sub(r"\([^)]*\)", "", words)  # the glosses in parentheses
        names[package] = {w.strip() for w in plain.split(",") if w.strip()}
    return names


def test_the_layout_map_lists_every_core_module_in_its_subpackage() -> None:
    folders = {
        p.name: {m.stem for m in p.glob("*.py") if m.stem != "__init__"}
        for p in CORE.iterdir()
        if (p / "__init__.py").is_file()
    }
    assert documented() == folders
    assert not [m.name for m in CORE.glob("*.py") if m.stem != "__init__"], "modules outside"


def test_the_layout_map_follows_the_core_contracts_floors() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    (inside,) = [c for c in contracts if c.get("containers") == ["gpushare.core"]]
    floors = [name.strip() for layer in inside["layers"] for name in layer.split("|")]
    assert list(documented()) == floors
