"""Prometheus's own PromQL parser and engine, for the dashboard and alert tests.

``tests/support/promqlcheck`` is a Go test binary of Prometheus's ``promql`` and ``promqltest``
packages (built and cached by ``harness/controlplane/build.sh``, keyed by its sources). This
module writes what to check into a folder and runs it: expressions to parse, promqltest scripts,
and instant queries over loaded samples whose answers come back for the test to compare.

Samples are what Prometheus stores after scraping several targets (``tests/promql.scrape``);
they are loaded as series holding their value for ten minutes, one point a minute, so counters
and gauges alike answer instant queries at any time in that span.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

SOURCE = Path(__file__).parent / "promqlcheck"
NAME = "__name__"

Labels = frozenset[tuple[str, str]]
Vector = dict[Labels, float]


def binary() -> Path | None:
    """The cached test binary built from these very sources, else None."""
    key = hashlib.sha256(
        b"".join((SOURCE / f).read_bytes() for f in ("go.mod", "go.sum", "check_test.go"))
    ).hexdigest()[:12]
    cache = Path(os.environ.get("GPUSHARE_CACHE", Path.home() / ".cache" / "gpushare"))
    found = cache / "bin" / f"promqlcheck-{key}" / "promqlcheck.test"
    return found if found.is_file() and os.access(found, os.X_OK) else None


def need_binary() -> Path:
    """The binary, or a skip saying how to build it (a failure under CI, by the conftest)."""
    found = binary()
    if found is None:
        pytest.skip("promqlcheck not built for these sources: run `make controlplane`")
    return found


def _run(files: Mapping[str, str], test: str) -> Path:
    folder = Path(tempfile.mkdtemp(prefix="promqlcheck-"))
    for name, text in files.items():
        (folder / name).write_text(text)
    done = subprocess.run(
        [str(need_binary()), "-test.run", f"^{test}$", "-test.v"],
        env={**os.environ, "PROMQLCHECK_DIR": str(folder)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"Prometheus's engine refused:\n{done.stdout}{done.stderr}"
    return folder


def parse_all(named: Iterable[tuple[str, str]]) -> None:
    """Parse each ``(name, expression)`` with Prometheus's parser; fail naming each error."""
    exprs = [{"name": n, "expr": e} for n, e in named]
    assert exprs
    _run({"exprs.json": json.dumps(exprs)}, "TestParse")


def run_scripts(scripts: Mapping[str, str]) -> None:
    """Run promqltest scripts (``name`` without the ``.test`` suffix → text)."""
    _run({f"{n}.test": t for n, t in scripts.items()}, "TestScripts")


def _series(labels: Labels) -> str:
    named = dict(labels)
    name = named.pop(NAME)
    inner = ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(named.items()))
    return f"{name}{{{inner}}}"


def load_block(samples: Vector) -> str:
    """A promqltest ``load`` block holding each sample's value from 0 to 10 minutes."""
    lines = ["load 1m"]
    lines += [f"  {_series(labels)} {value!r}x10" for labels, value in sorted(samples.items())]
    return "\n".join(lines) + "\n"


def evaluate_all(queries: Iterable[tuple[str, Vector]], *, at_s: float = 300) -> list[Vector]:
    """The engine's answer to each ``(expression, samples)`` at ``at_s``, as label sets → values.

    A scalar answer is a vector of one sample with no labels. An expression the engine refuses
    fails the test with its message.
    """
    batch = [
        {"name": str(i), "load": load_block(samples), "expr": expr, "at": at_s}
        for i, (expr, samples) in enumerate(queries)
    ]
    folder = _run({"queries.json": json.dumps(batch)}, "TestEval")
    out = []
    for query, answer in zip(batch, json.loads((folder / "results.json").read_text()), strict=True):
        assert not answer.get("error"), f"{query['expr']}: {answer['error']}"
        out.append({frozenset(s["labels"].items()): s["value"] for s in answer["samples"]})
    return out


def evaluate(expr: str, samples: Vector, variables: Mapping[str, str] | None = None) -> Vector:
    """One expression's answer, Grafana's variables replaced first (see :func:`evaluate_all`)."""
    [answer] = evaluate_all([(grafana(expr, variables or {}), samples)])
    return answer


def grafana(expr: str, variables: Mapping[str, str]) -> str:
    """The expression as Grafana sends it: ``$name`` and ``${name}`` replaced (longest first),
    and ``$__rate_interval`` as Grafana computes it for a 30 s scrape interval (4 x 30 s)."""
    values = {"__rate_interval": "2m", **variables}
    for name, value in sorted(values.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(f"${{{name}}}", value).replace(f"${name}", value)
    assert "$" not in expr, f"unreplaced variable in {expr!r}"
    return expr
