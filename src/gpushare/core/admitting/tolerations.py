"""Tolerations the steering webhook adds to the GPU pods it sees (the chart's
``webhook.steer.tolerations``, ``gpushare webhook --steer-toleration``).

Managed GPU pools taint their nodes: GKE puts ``nvidia.com/gpu=present:NoSchedule`` on every GPU
node, and AKS pools are commonly given a taint of the cluster owner's choice. Kubernetes'
``ExtendedResourceToleration`` admission plugin adds a toleration for the *requested* extended
resource only (kubernetes/kubernetes#55839): a pod asking for ``aliyun.com/gpu-mem`` gets one for
``aliyun.com/gpu-mem``, never for ``nvidia.com/gpu``, and AKS does not run the plugin at all
(Azure/AKS#1449). So a tenant's GPU pod stays Pending on such a pool unless every manifest
carries the platform's toleration. The steering webhook, which already sees every new GPU pod,
adds the tolerations the cluster administrator listed instead.

A toleration is written on the command line as JSON (a Kubernetes ``Toleration`` object) or as
``key[=value][:effect]`` (``nvidia.com/gpu:NoSchedule`` tolerates the key with any value,
``sku=gpu:NoSchedule`` that value only). ``missing`` answers which of them a pod does not
already carry, so a pod that tolerates them itself is left as it is and a pod is never given
the same toleration twice.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
"""A taint's effects (core/v1 ``TaintEffect``); a toleration with none tolerates them all."""

OPERATORS = ("Exists", "Equal")

_FIELDS = frozenset({"key", "operator", "value", "effect", "tolerationSeconds"})


@dataclass(frozen=True)
class Toleration:
    """One core/v1 Toleration, as the webhook adds it to a pod."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""
    toleration_seconds: int | None = None
    """Only with ``NoExecute``: how long the pod stays once the taint appears (None: forever)."""

    def as_json(self) -> dict[str, Any]:
        """The toleration as the API writes it: empty fields left out."""
        out: dict[str, Any] = {}
        if self.key:
            out["key"] = self.key
        out["operator"] = self.operator
        if self.value:
            out["value"] = self.value
        if self.effect:
            out["effect"] = self.effect
        if self.toleration_seconds is not None:
            out["tolerationSeconds"] = self.toleration_seconds
        return out


def parse_toleration(text: str) -> Toleration:
    """A toleration from JSON or ``key[=value][:effect]``; ValueError naming what is wrong."""
    text = text.strip()
    if text.startswith("{"):
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(
                f"{text!r} is not JSON ({err.msg}); write a Toleration object "
                f'such as {{"key": "nvidia.com/gpu", "operator": "Exists"}}'
            ) from None
        return from_json(raw, text)
    rest, _, effect = text.partition(":")
    key, equal, value = rest.partition("=")
    return _checked(
        Toleration(key=key, operator="Equal" if equal else "Exists", value=value, effect=effect),
        text,
    )


def from_json(raw: Any, shown: str = "") -> Toleration:
    """A toleration from a Toleration object (the chart's values); ValueError if invalid."""
    shown = shown or json.dumps(raw)
    if not isinstance(raw, Mapping):
        raise ValueError(f"{shown!r} is not an object; write a Toleration object")
    unknown = sorted(set(raw) - _FIELDS)
    if unknown:
        raise ValueError(
            f"{shown!r} has unknown field(s) {', '.join(unknown)}; a Toleration has "
            f"{', '.join(sorted(_FIELDS))}"
        )
    seconds = raw.get("tolerationSeconds")
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, int)):
        raise ValueError(f"{shown!r}: tolerationSeconds={seconds!r} is not a whole number")
    strings = {name: raw.get(name) or "" for name in ("key", "value", "effect")}
    for name, found in strings.items():
        if not isinstance(found, str):
            raise ValueError(f"{shown!r}: {name}={found!r} is not a string")
    operator = raw.get("operator") or "Equal"
    return _checked(
        Toleration(
            key=strings["key"],
            operator=str(operator),
            value=strings["value"],
            effect=strings["effect"],
            toleration_seconds=seconds,
        ),
        shown,
    )


def _checked(toleration: Toleration, shown: str) -> Toleration:
    """The toleration if the API server would accept it (``ValidateTolerations``)."""
    if toleration.operator not in OPERATORS:
        raise ValueError(
            f"{shown!r}: operator={toleration.operator!r} is not one of {', '.join(OPERATORS)}"
        )
    if toleration.effect and toleration.effect not in EFFECTS:
        raise ValueError(
            f"{shown!r}: effect={toleration.effect!r} is not one of {', '.join(EFFECTS)} "
            f"(or none, for every effect)"
        )
    if toleration.operator == "Exists" and toleration.value:
        raise ValueError(f"{shown!r}: operator Exists takes no value; drop value or use Equal")
    if not toleration.key and toleration.operator != "Exists":
        raise ValueError(f"{shown!r}: a toleration without a key must use operator Exists")
    if toleration.toleration_seconds is not None and toleration.effect != "NoExecute":
        raise ValueError(f"{shown!r}: tolerationSeconds is only allowed with effect NoExecute")
    return toleration


def _normalised(raw: Any) -> dict[str, Any] | None:
    """A pod's toleration in the form ``as_json`` writes, or None if it cannot be read."""
    try:
        return from_json(raw).as_json()
    except ValueError:
        return None


def missing(pod_tolerations: Any, wanted: Sequence[Toleration]) -> list[Toleration]:
    """Which of ``wanted`` the pod's ``spec.tolerations`` do not already hold."""
    held = pod_tolerations if isinstance(pod_tolerations, list) else []
    have = [found for found in (_normalised(t) for t in held) if found is not None]
    out: list[Toleration] = []
    for toleration in wanted:
        if toleration.as_json() not in have and toleration not in out:
            out.append(toleration)
    return out


def patch(pod_tolerations: Any, add: Sequence[Toleration]) -> list[dict[str, Any]]:
    """The JSON patch operations that append ``add`` to the pod's ``spec.tolerations``."""
    if not add:
        return []
    if not isinstance(pod_tolerations, list):
        return [{"op": "add", "path": "/spec/tolerations", "value": [t.as_json() for t in add]}]
    return [{"op": "add", "path": "/spec/tolerations/-", "value": t.as_json()} for t in add]
