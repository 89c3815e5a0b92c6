"""The README and docs/ point only at what exists: files, headings, and paths they name.

Relative links must reach a file of the repository, and a ``#anchor`` a heading of that file
(GitHub's spelling: lower case, punctuation dropped, spaces as hyphens). Paths written in code
spans (``src/...``, ``tests/...``, ``charts/...``) must exist too, so a moved module does not
leave its old name behind in the prose. Every file under docs/ is reachable from the README.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
SPAN = re.compile(r"`([^`\n]+)`")
PATH = re.compile(r"^(?:src|tests|harness|charts|deploy|benchmarks|examples|docs)/[\w./-]*\w$")
MODULE = re.compile(
    r"^(?:core|kube|sim|extender|inspect|deviceplugin|isolation|webhook)(?:/\w+)*/\w+\.py$"
)
"""A module named from the package root, as ``core/placement/ranking.py``."""


def prose(text: str) -> str:
    """The text outside fenced code blocks."""
    kept, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            kept.append(line)
    return "\n".join(kept)


def slug(heading: str) -> str:
    """A heading's anchor as GitHub writes it."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of every heading in ``path``."""
    found = re.findall(r"^#{1,6} (.+)$", prose(path.read_text()), flags=re.MULTILINE)
    return {slug(h) for h in found}


def broken(path: Path, root: Path = ROOT) -> list[str]:
    """What in ``path`` points at nothing: links, anchors and code-span paths."""
    text = prose(path.read_text())
    problems = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):
            continue  # http:, https:, mailto:
        name, _, anchor = target.partition("#")
        where = (path.parent / name).resolve() if name else path
        if not where.exists():
            problems.append(f"{path.name}: link to {target}: no file {where}")
        elif anchor and where.suffix == ".md" and anchor not in anchors(where):
            problems.append(f"{path.name}: link to {target}: no heading #{anchor} in {where.name}")
    for span in SPAN.findall(text):
        candidate = span.split("::")[0]
        if MODULE.match(candidate):
            candidate = f"src/gpushare/{candidate}"
        elif not PATH.match(candidate) or "*" in candidate:
            continue
        if not (root / candidate).exists():
            problems.append(f"{path.name}: `{span}` names {candidate}, which does not exist")
    return problems


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: p.name)
def test_every_link_anchor_and_named_path_exists(path: Path) -> None:
    assert broken(path) == []


def test_every_docs_file_is_linked_from_the_readme() -> None:
    readme = prose((ROOT / "README.md").read_text())
    linked = {Path(t.partition("#")[0]).name for t in LINK.findall(readme)}
    assert [p.name for p in DOCUMENTS[1:] if p.name not in linked] == []


def test_the_checker_finds_broken_links(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# Title: one\n\n## Two's part\n")
    doc = tmp_path / "b.md"
    doc.write_text(
        "[ok](a.md#title-one) [ok](a.md#twos-part) [gone](c.md) [bad](a.md#three)\n"
        "[self](#here) `src/nowhere.py` `core/gone.py` [web](https://example.com)\n"
        "```\n[in a fence](d.md)\n```\n"
    )
    assert broken(doc, root=tmp_path) == [
        f"b.md: link to c.md: no file {tmp_path / 'c.md'}",
        "b.md: link to a.md#three: no heading #three in a.md",
        "b.md: link to #here: no heading #here in b.md",
        "b.md: `src/nowhere.py` names src/nowhere.py, which does not exist",
        "b.md: `core/gone.py` names src/gpushare/core/gone.py, which does not exist",
    ]
