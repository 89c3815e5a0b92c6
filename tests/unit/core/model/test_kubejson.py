"""A pod's identity is read one way everywhere (core.model.kubejson), whatever the object lacks."""

from __future__ import annotations

from typing import Any

import pytest

from gpushare.core.model.kubejson import key_of, name_of, namespace_of, stored_uid_of, uid_of
from gpushare.extender.events import PodRef

STORED = {"metadata": {"name": "p", "namespace": "team-a", "uid": "u-1"}}
UNSTORED: dict[str, Any] = {"metadata": {"name": "p"}}


@pytest.mark.parametrize("metadata", [None, [], "x", {}])
def test_odd_metadata_reads_as_empty(metadata: Any) -> None:
    pod = {"metadata": metadata}
    assert (name_of(pod), namespace_of(pod), stored_uid_of(pod)) == ("", "default", "")


def test_stored_and_unstored_pods() -> None:
    assert key_of(STORED) == "team-a/p" and key_of(UNSTORED) == "default/p"
    assert stored_uid_of(STORED) == uid_of(STORED) == "u-1"
    # a ledger key needs something unique; an event or a bind check needs the real UID or none
    assert uid_of(UNSTORED) == "default/p" and stored_uid_of(UNSTORED) == ""


def test_an_event_names_the_pod_as_stored() -> None:
    assert PodRef.of(STORED) == PodRef(namespace="team-a", name="p", uid="u-1")
    assert PodRef.of(UNSTORED) == PodRef(namespace="default", name="p", uid="")
