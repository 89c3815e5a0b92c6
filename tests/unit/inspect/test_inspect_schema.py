"""``kubectl inspect cgpu -o json``: one key style, and output that validates against its schema.

The schema is checked with a small validator for the keywords the emitted schema uses (and
refuses any other keyword, so a schema that grows new ones fails here rather than passing
unchecked).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from click.testing import CliRunner

from gpushare.core.booking.ledger import Ledger
from gpushare.core.model.inventory import read_node
from gpushare.inspect.cli import main as inspect_cgpu
from gpushare.inspect.explain import explanation_json
from gpushare.inspect.schema import json_schema
from gpushare.inspect.view import build_view, to_json
from gpushare.kube.objects import gpu_node
from tests.support.inspecting import explain, mixed_view

CAMEL = re.compile(r"^[a-z][a-zA-Z0-9]*$")
GPU_INDEX = re.compile(r"^[0-9]+$")
TYPES: dict[str, type | tuple[type, ...]] = {
    "object": dict,
    "array": list,
    "string": str,
    "integer": int,
    "boolean": bool,
}
KNOWN = {
    "$defs",
    "$ref",
    "$schema",
    "additionalProperties",
    "const",
    "default",
    "description",
    "enum",
    "items",
    "properties",
    "required",
    "title",
    "type",
}


def violations(
    value: Any, schema: dict[str, Any], root: dict[str, Any], at: str = "$"
) -> list[str]:
    """What in ``value`` breaks ``schema`` (a JSON Schema subset), as ``path: problem``."""
    unknown = set(schema) - KNOWN
    assert not unknown, f"{at}: schema keyword(s) the test cannot check: {unknown}"
    if "$ref" in schema:
        name = schema["$ref"].removeprefix("#/$defs/")
        return violations(value, root["$defs"][name], root, at)
    out: list[str] = []
    kind = schema.get("type")
    if kind is not None:
        ok = isinstance(value, TYPES[kind]) and not (kind == "integer" and isinstance(value, bool))
        if not ok:
            return [f"{at}: {value!r} is not {kind}"]
    if "const" in schema and value != schema["const"]:
        out.append(f"{at}: {value!r} != {schema['const']!r}")
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{at}: {value!r} not in {schema['enum']}")
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        out += [f"{at}: missing {key}" for key in schema.get("required", []) if key not in value]
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in properties:
                out += violations(item, properties[key], root, f"{at}.{key}")
            elif extra is False:
                out.append(f"{at}: unexpected key {key}")
            elif isinstance(extra, dict):
                out += violations(item, extra, root, f"{at}.{key}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            out += violations(item, schema["items"], root, f"{at}[{i}]")
    return out


def keys(value: Any) -> list[str]:
    """Every object key in a JSON document, GPU-index map keys left out."""
    if isinstance(value, dict):
        found = [k for k in value if not GPU_INDEX.match(k)]
        return found + [k for v in value.values() for k in keys(v)]
    if isinstance(value, list):
        return [k for v in value for k in keys(v)]
    return []


def summary_document() -> dict[str, Any]:
    view = mixed_view()
    plain = read_node(gpu_node("c-plain", ip="10.0.0.3", gpus_units=[15], mode=None))
    extra = build_view([plain], Ledger())
    assert extra.unlabelled == ("c-plain",)
    data = to_json(view)
    data["unlabelledNodes"] = list(extra.unlabelled)
    return data


def test_summary_json_validates_against_its_schema_and_is_camel_case() -> None:
    data = summary_document()
    schema = json_schema("summary")
    assert violations(data, schema, schema) == []
    assert [k for k in keys(data) if not CAMEL.match(k)] == []
    assert data["nodes"][0]["pods"][1]["memUnits"] == {"1": 7}


def test_explain_json_validates_against_its_schema_and_is_camel_case() -> None:
    for mem in (3, 14):
        data = explanation_json(explain(mem))
        schema = json_schema("explain")
        assert violations(data, schema, schema) == []
        assert [k for k in keys(data) if not CAMEL.match(k)] == []
    assert "boundTo" in data and "bound_to" not in data


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (lambda d: d["nodes"][0].update(total_units=1), "unexpected key total_units"),
        (lambda d: d["cluster"].pop("totalMib"), "missing totalMib"),
        (lambda d: d["nodes"][0]["gpus"][0].update(healthy="yes"), "is not boolean"),
        (lambda d: d["nodes"][0]["pods"][0].update(state="running"), "not in"),
    ],
)
def test_the_checker_refuses_documents_that_break_the_schema(change: Any, needle: str) -> None:
    data = summary_document()
    change(data)
    schema = json_schema("summary")
    assert any(needle in v for v in violations(data, schema, schema))


def test_the_plugin_prints_each_schema() -> None:
    for name in ("summary", "explain"):
        result = CliRunner().invoke(inspect_cgpu, ["--schema", name])
        assert result.exit_code == 0, result.output
        assert json.loads(result.output) == json_schema(name)
    bad = CliRunner().invoke(inspect_cgpu, ["--schema", "table"])
    assert bad.exit_code == 2 and "'table' is not one of" in bad.output
