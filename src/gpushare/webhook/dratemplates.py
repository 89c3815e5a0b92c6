"""The ResourceClaimTemplate a converted pod needs, created before the webhook answers.

The pod's ``spec.resourceClaims`` names ``gpushare-<hash>``; kube-controller-manager makes the
pod's claim from that template, and waits (the pod Pending, an event saying so) while it is
missing. So the template is created in the pod's namespace before the patch is sent back:

- one template per shape and namespace, named by the hash of its spec, so creating it again is
  a no-op: an AlreadyExists (409) whose stored spec is the same (as the API server stores it:
  ``_claim_spec``) is success, also when another replica created it a moment before;
- a stored template of that name with another spec (written by hand) is a failure with the
  difference named, and the pod is refused rather than given a claim it did not ask for;
- a dry run creates nothing (the configuration says ``sideEffects: NoneOnDryRun``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gpushare.kube.port import ClaimTemplateAPI, Conflict, KubeError


def _claim_spec(template: Mapping[str, Any]) -> tuple[Any, Any]:
    """What two templates must share to be the same shape: the claim's spec and the metadata the
    claims get. The API server stores an absent ``spec.metadata`` as ``{}`` (kube-apiserver
    v1.36.3, seen in tests/e2e/test_dra_objects.py), so both read as empty alike."""
    spec = template.get("spec") or {}
    return spec.get("metadata") or {}, spec.get("spec")


async def ensure_template(api: ClaimTemplateAPI, template: Mapping[str, Any]) -> str:
    """Make sure ``template`` exists as written; "" when it does, else what went wrong."""
    metadata = template.get("metadata") or {}
    namespace, name = str(metadata.get("namespace", "")), str(metadata.get("name", ""))
    try:
        await api.create_claim_template(template)
        return ""
    except Conflict:
        pass
    except KubeError as err:
        return str(err)
    try:
        stored = await api.get_claim_template(namespace, name)
    except KubeError as err:
        return f"{name} exists in {namespace} but could not be read: {err}"
    if _claim_spec(stored) == _claim_spec(template):
        return ""
    return (
        f"resourceclaimtemplate {namespace}/{name} exists with another spec "
        f"({json.dumps(stored.get('spec'), sort_keys=True)[:300]}); gpushare names its templates "
        f"gpushare-<hash of the spec>: delete that template, or rename it if it was written by hand"
    )
