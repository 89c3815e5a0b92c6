"""Every node annotation the device plugin writes is one its ValidatingAdmissionPolicy allows.

The policy (webhook/noderestriction.py, rendered into the chart's deviceplugin-policy.yaml, the
two kept equal by tests/integration/chart/test_chart.py) lists the node annotations the plugin may
change. A new annotation written without being added there is refused by the API server on
every write, which no test with admin credentials sees: ``gpushare.io/gpu-used`` was refused
every five minutes this way. So the plugin's source is read here for every annotation key it
hands to ``patch_node``, and each must be in the list.
"""

from __future__ import annotations

import ast
from pathlib import Path

from gpushare.core.model import names
from gpushare.webhook.noderestriction import NODE_ANNOTATIONS

SRC = Path(__file__).resolve().parents[3] / "src" / "gpushare"
PLUGIN_SOURCES = [
    *sorted((SRC / "deviceplugin").rglob("*.py")),
    *sorted((SRC / "node").rglob("*.py")),
    SRC / "cli" / "deviceplugin.py",
]


def _key(node: ast.expr, module: ast.Module) -> str:
    """An annotation key written as a names constant, a local constant or a literal."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        if hasattr(names, node.id):
            return str(getattr(names, node.id))
        for stmt in module.body:
            if (
                isinstance(stmt, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == node.id for t in stmt.targets)
                and isinstance(stmt.value, ast.Constant)
            ):
                return str(stmt.value.value)
    raise AssertionError(f"cannot tell which annotation {ast.unparse(node)} is")


def written_node_annotations() -> dict[str, str]:
    """Each annotation key passed to ``patch_node(annotations={...})``, with where."""
    found: dict[str, str] = {}
    for path in PLUGIN_SOURCES:
        module = ast.parse(path.read_text())
        for call in ast.walk(module):
            if not (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr == "patch_node"
            ):
                continue
            for keyword in call.keywords:
                if keyword.arg != "annotations":
                    continue
                assert isinstance(keyword.value, ast.Dict), (
                    f"{path}:{call.lineno}: write the annotations as a dict literal, so this "
                    "test can read which keys the plugin writes"
                )
                for key in keyword.value.keys:
                    if key is None:  # **spread: a helper's patch, read where it is built
                        continue
                    found[_key(key, module)] = f"{path.relative_to(SRC)}:{call.lineno}"
    return found


def test_the_scan_finds_the_publishing_and_usage_writes() -> None:
    written = written_node_annotations()
    assert names.ANN_NODE_GPUS in written and names.ANN_NODE_GPU_USED in written


def test_every_node_annotation_the_plugin_writes_is_allowed_by_its_policy() -> None:
    """The topology annotation comes through a helper (``topology_change``), named here."""
    written = {**written_node_annotations(), names.ANN_NODE_TOPOLOGY: "publishing.topology_change"}
    refused = {key: where for key, where in written.items() if key not in NODE_ANNOTATIONS}
    assert not refused, (
        f"the device plugin writes node annotations its ValidatingAdmissionPolicy refuses: "
        f"{refused}; add them to NODE_ANNOTATIONS in webhook/noderestriction.py and render "
        "charts/gpushare/templates/deviceplugin-policy.yaml again"
    )
