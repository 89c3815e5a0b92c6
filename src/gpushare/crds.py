"""The ResourcePolicy CustomResourceDefinition, rendered from one place.

The chart ships it in ``charts/gpushare/crds/`` (a unit test checks the file equals
``render_yaml(resource_policy_crd())``) and the e2e harness applies the same text. The schema
carries ACK's fields; a unit whose ``resource`` is ECI, elastic or ACS capacity is refused when
the policy is applied, with a message that says what to do
(``core.resourcepolicies.resourcepolicy``), and so is a
policy of more than ``MAX_UNITS`` units (``maxItems``: the API server names the field and the
limit).
"""

from __future__ import annotations

from typing import Any

import yaml

from gpushare.core.resourcepolicies.resourcepolicy import (
    GROUP,
    KIND,
    MAX_UNITS,
    NEXT_POLICY_ALIASES,
    PLURAL,
    VERSION,
    NextPolicy,
    PreemptPolicy,
)


def _labels() -> dict[str, Any]:
    """A string map's schema; a fresh dict each time, so the YAML carries no anchors."""
    return {"type": "object", "additionalProperties": {"type": "string"}}


REFUSED_MESSAGE = (
    "gpushare shares GPUs only on the cluster's own nodes (resource ecs); ECI, elastic and ACS "
    "capacity has no GPU gpushare can book: remove the unit or use resource ecs with a "
    "nodeSelector"
)


def _unit() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "resource": {
                "type": "string",
                "default": "ecs",
                "x-kubernetes-validations": [{"rule": "self == 'ecs'", "message": REFUSED_MESSAGE}],
            },
            "nodeSelector": _labels(),
            "max": {"type": "integer", "minimum": 0},
            "podLabels": _labels(),
            "podAnnotations": _labels(),
        },
    }


def resource_policy_crd() -> dict[str, Any]:
    """The CRD as a dict."""
    spec = {
        "type": "object",
        "required": ["selector", "units"],
        "properties": {
            "selector": _labels(),
            "strategy": {"type": "string", "enum": ["prefer"], "default": "prefer"},
            "units": {"type": "array", "minItems": 1, "maxItems": MAX_UNITS, "items": _unit()},
            "preemptPolicy": {"type": "string", "enum": [p.value for p in PreemptPolicy]},
            "whenTryNextUnits": {
                "type": "object",
                "properties": {
                    "policy": {
                        "type": "string",
                        "enum": [p.value for p in NextPolicy] + list(NEXT_POLICY_ALIASES),
                    },
                    "timeout": {"type": "string"},
                },
            },
            "ignorePreviousPod": {"type": "boolean"},
            "ignoreTerminatingPod": {"type": "boolean"},
            "matchLabelKeys": {"type": "array", "items": {"type": "string"}},
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": ["rp"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {"spec": spec},
                        }
                    },
                }
            ],
        },
    }


def render_yaml(crd: dict[str, Any]) -> str:
    """YAML text with a header that says where it comes from."""
    header = "# Generated from gpushare/crds.py; a unit test keeps this file equal to it.\n"
    return header + yaml.safe_dump(crd, sort_keys=False)
