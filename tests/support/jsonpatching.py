"""Apply a JSON Patch (RFC 6902 ``add`` and ``remove``, the operations gpushare's webhooks send)
to a copy of an object, as the API server would, for tests that check the patched pod."""

from __future__ import annotations

import base64
import json
from typing import Any


def _segments(path: str) -> list[str]:
    return [s.replace("~1", "/").replace("~0", "~") for s in path.lstrip("/").split("/")]


def apply(obj: dict[str, Any], operations: list[dict[str, Any]]) -> dict[str, Any]:
    """A copy of ``obj`` with the operations applied in order."""
    out: Any = json.loads(json.dumps(obj))
    for op in operations:
        *parents, last = _segments(op["path"])
        node = out
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if op["op"] == "add":
            if isinstance(node, list):
                node.insert(len(node) if last == "-" else int(last), op["value"])
            else:
                node[last] = op["value"]
        elif op["op"] == "remove":
            del node[int(last) if isinstance(node, list) else last]
        else:
            raise AssertionError(f"unexpected operation {op}")
    assert isinstance(out, dict)
    return out


def patched(review: dict[str, Any], obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` with the AdmissionReview response's patch applied (a copy when there is none)."""
    response = review["response"]
    if "patch" not in response:
        return apply(obj, [])
    assert response["patchType"] == "JSONPatch"
    return apply(obj, json.loads(base64.b64decode(response["patch"])))
