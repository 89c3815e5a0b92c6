"""Every package says what its modules hold, and docs/architecture.md's layout map says it too.

Two maps, both checked against the folders, so that a module added, moved or removed without
its maps fails here, naming the module and the map to fix:

- each package's ``__init__`` docstring lists its modules and subpackages, one bullet each
  (``- ``name``: what it holds``; several names may share one bullet: ``- ``a``, ``b``: ...``)
  for every package of ``gpushare``, the harness and the tests' support;
- docs/architecture.md's layout map has one entry per package of ``gpushare``
  (``src/gpushare/<path>/  name (gloss), name, ...``) that names the same modules and
  subpackages.

The core's subpackages are layered by an import contract of their own (``pyproject.toml``); the
map lists them in the contract's order, top floor first.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
CORE = SRC / "gpushare" / "core"
ENTRY = re.compile(r"^(src/gpushare/(?:[\w/]+/)?)\s+(.*)$")
CONTINUED = re.compile(r"^\s{20,}(\S.*)$")
BULLET = re.compile(r"^- ((?:``\w+``(?:, | and |, and ))*``\w+``):")
NAME = re.compile(r"``(\w+)``")
GENERATED = re.compile(r"^api_pb2")
"""The gRPC stubs packaging/ generates at build time: not in the maps."""


def members(package: Path) -> set[str]:
    """The modules and subpackages of ``package``."""
    modules = {
        m.stem for m in package.glob("*.py") if m.stem != "__init__" and not GENERATED.match(m.stem)
    }
    return modules | {d.name for d in package.iterdir() if (d / "__init__.py").is_file()}


def packages(top: Path) -> list[Path]:
    """``top`` and every package under it that has modules or subpackages."""
    found = [p.parent for p in top.rglob("__init__.py") if "__pycache__" not in p.parts]
    return sorted(p for p in found if members(p))


def mapped(package: Path) -> set[str]:
    """The names the bullets of the package's ``__init__`` docstring list."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    names: set[str] = set()
    for line in doc.splitlines():
        bullet = BULLET.match(line)
        if bullet:
            names |= set(NAME.findall(bullet.group(1)))
    return names


def documented() -> dict[str, set[str]]:
    """Package path (``src/gpushare/kube/``) -> the names its layout map entry lists."""
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
        plain = words
        while re.search(r"\([^()]*\)", plain):  # the glosses in parentheses, nested ones too
            plain = re.sub(r"\([^()]*\)", "", plain)
        names[package] = {w.strip() for w in plain.split(",") if w.strip()}
    return names


def where(package: Path) -> str:
    return package.relative_to(ROOT).as_posix() + "/"


MAPPED = [
    *packages(SRC / "gpushare"),
    *packages(ROOT / "harness"),
    *packages(ROOT / "tests" / "support"),
]


@pytest.mark.parametrize("package", MAPPED, ids=where)
def test_each_package_init_maps_its_modules(package: Path) -> None:
    have, listed = members(package), mapped(package)
    init = package.relative_to(ROOT) / "__init__.py"
    missing, stale = sorted(have - listed), sorted(listed - have)
    assert not missing, (
        f"{init}: its docstring's map lacks {', '.join(missing)}; add a line "
        f"'- ``{missing[0]}``: what it holds' for each"
    )
    assert not stale, (
        f"{init}: its docstring's map lists {', '.join(stale)}, not in {where(package)}"
    )


def test_the_layout_map_lists_every_module_of_every_package() -> None:
    entries = documented()
    problems = []
    for package in packages(SRC / "gpushare"):
        key = where(package)
        if key not in entries:
            problems.append(f"no entry {key} (it holds {', '.join(sorted(members(package)))})")
            continue
        have = members(package)
        allowed = have | {d.name for d in package.iterdir() if d.is_dir()}
        missing, stale = sorted(have - entries[key]), sorted(entries[key] - allowed)
        if missing:
            problems.append(f"{key} lacks {', '.join(missing)}")
        if stale:
            problems.append(f"{key} lists {', '.join(stale)}, not there")
    problems += [f"{key} is not there" for key in entries if not (ROOT / key).is_dir()]
    assert not problems, "docs/architecture.md's layout map: " + "; ".join(problems)


def test_the_layout_map_follows_the_core_contracts_floors() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    (inside,) = [c for c in contracts if c.get("containers") == ["gpushare.core"]]
    floors = [name.strip() for layer in inside["layers"] for name in layer.split("|")]
    core = where(CORE)
    order = [k.removeprefix(core).rstrip("/") for k in documented() if k.startswith(core)]
    assert [o for o in order if o] == floors
    assert not [m.name for m in CORE.glob("*.py") if m.stem != "__init__"], "modules outside"
