"""Hostile Kubernetes objects: every field and annotation gpushare reads, set to what a tenant
(or a broken client) could put there.

A tenant controls its pods' whole spec, labels and annotations; a node's annotations and labels
are written by the device plugin's identity, which a compromised node holds. kube-apiserver
validates the types of built-in fields, but a body sent to the extender's routes by anything
that reaches its port is not validated at all, and annotation and label values are any string.
So the strategies below put, at each path gpushare reads, values of every JSON type and strings
that break naive parsing: Unicode digits that ``str.isdigit`` accepts and ``int`` refuses,
numbers past Python's 4,300-digit conversion limit, huge exponents, JSON inside JSON.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

from hypothesis import strategies as st

from gpushare.core.model import names

Path = tuple[str | int, ...]

HOSTILE_STRINGS = (
    "",
    " ",
    "²",
    "٣",
    "1²",
    "-1",
    "+3",
    "3.5",
    "1e400",
    "1" * 4301,
    "9" * 70,
    "0x10",
    "NaN",
    "inf",
    "null",
    "[]",
    "{}",
    '{"a": 1}',
    "[1, 2]",
    "[" * 2000,
    '[{"index": "²"}]',
    '[{"index": 0, "memUnits": "x"}]',
    '[{"index": 1e400, "memUnits": 1}]',
    '{"version": 1, "links": "x"}',
    "0,1,²",
    "1,,3",
    "1;2",
    "a" * 70000,
    "\x00",
    "\udcff"[:0] + "é",
    "1k",
    "1Gi",
    "true",
)
"""Strings chosen to break parsers: not the random ones hypothesis finds eventually."""


def _prefixes(*path: str | int, start: int) -> tuple[Path, ...]:
    """Every prefix of ``path`` from ``start`` steps on: each level of a nested field."""
    return tuple(path[:end] for end in range(start, len(path) + 1))


POD_PATHS: tuple[Path, ...] = (
    ("metadata",),
    ("metadata", "name"),
    ("metadata", "namespace"),
    ("metadata", "uid"),
    ("metadata", "labels"),
    ("metadata", "labels", names.LABEL_POD_GPU_COUNT),
    ("metadata", "annotations"),
    *(("metadata", "annotations", key) for key in names.POD_ANNOTATIONS),
    ("metadata", "creationTimestamp"),
    ("metadata", "deletionTimestamp"),
    ("metadata", "generateName"),
    ("metadata", "ownerReferences"),
    ("spec",),
    ("spec", "nodeName"),
    ("spec", "schedulerName"),
    ("spec", "priority"),
    ("spec", "containers"),
    ("spec", "containers", 0),
    ("spec", "containers", 0, "name"),
    ("spec", "containers", 0, "resources"),
    ("spec", "containers", 0, "resources", "limits"),
    ("spec", "containers", 0, "resources", "limits", names.DEFAULT_NAMES.mem),
    ("spec", "containers", 0, "resources", "limits", names.DEFAULT_NAMES.core),
    ("spec", "containers", 0, "resources", "limits", "cpu"),
    ("spec", "containers", 0, "resources", "requests"),
    ("spec", "containers", 0, "resources", "requests", "memory"),
    ("spec", "containers", 0, "env"),
    ("spec", "containers", 0, "envFrom"),
    ("spec", "containers", 0, "volumeMounts"),
    ("spec", "containers", 0, "restartPolicy"),
    ("spec", "initContainers"),
    ("spec", "initContainers", 0),
    ("spec", "affinity"),
    ("spec", "affinity", "nodeAffinity"),
    *_prefixes(
        "spec",
        "affinity",
        "nodeAffinity",
        "requiredDuringSchedulingIgnoredDuringExecution",
        "nodeSelectorTerms",
        0,
        "matchExpressions",
        0,
        "values",
        start=4,
    ),
    ("spec", "affinity", "nodeAffinity", "preferredDuringSchedulingIgnoredDuringExecution"),
    ("spec", "affinity", "podAffinity"),
    *_prefixes(
        "spec",
        "affinity",
        "podAffinity",
        "requiredDuringSchedulingIgnoredDuringExecution",
        0,
        "labelSelector",
        start=4,
    ),
    ("spec", "affinity", "podAffinity", "preferredDuringSchedulingIgnoredDuringExecution"),
    ("spec", "affinity", "podAffinity", "preferredDuringSchedulingIgnoredDuringExecution", 0),
    ("spec", "affinity", "podAntiAffinity"),
    ("spec", "affinity", "podAntiAffinity", "preferredDuringSchedulingIgnoredDuringExecution"),
    ("spec", "overhead"),
    ("spec", "overhead", "cpu"),
    ("spec", "resources"),
    ("spec", "resources", "limits"),
    ("spec", "resources", "requests"),
    ("spec", "nodeSelector"),
    ("spec", "nodeSelector", "x"),
    ("spec", "tolerations"),
    ("spec", "topologySpreadConstraints"),
    ("spec", "topologySpreadConstraints", 0),
    ("spec", "topologySpreadConstraints", 0, "whenUnsatisfiable"),
    ("spec", "topologySpreadConstraints", 0, "labelSelector"),
    ("spec", "volumes"),
    ("spec", "volumes", 0),
    ("spec", "resourceClaims"),
    ("status",),
    ("status", "phase"),
    ("status", "containerStatuses"),
    ("status", "containerStatuses", 0),
    ("status", "initContainerStatuses"),
)
"""Where gpushare reads a pod (``core.model.requests``, ``core.model.hostresources``,
``core.placement.preferences``,
``core.booking.ledger``, ``core.records.trust``, ``core.resourcepolicies.policybook``,
``core.model.spreading``)."""

NODE_PATHS: tuple[Path, ...] = (
    ("metadata",),
    ("metadata", "name"),
    ("metadata", "labels"),
    ("metadata", "labels", names.LABEL_MODE),
    ("metadata", "labels", names.LABEL_PLACEMENT),
    ("metadata", "labels", "kubernetes.io/hostname"),
    ("metadata", "annotations"),
    *(
        ("metadata", "annotations", key)
        for key in (
            names.ANN_NODE_GPUS,
            names.ANN_NODE_UNIT,
            names.ANN_NODE_GPUS_DISABLED,
            names.ANN_NODE_TOPOLOGY,
            names.ANN_NODE_HANDOFF,
        )
    ),
    ("spec",),
    ("spec", "taints"),
    ("spec", "taints", 0),
    ("spec", "taints", 0, "effect"),
    ("spec", "unschedulable"),
    ("status",),
    ("status", "capacity"),
    ("status", "capacity", names.DEFAULT_NAMES.mem),
    ("status", "capacity", names.DEFAULT_NAMES.count),
    ("status", "capacity", names.DEFAULT_NAMES.core),
    ("status", "allocatable"),
    ("status", "allocatable", names.DEFAULT_NAMES.mem),
    ("status", "allocatable", names.DEFAULT_NAMES.count),
    ("status", "allocatable", "cpu"),
    ("status", "addresses"),
    ("status", "addresses", 0),
)
"""Where gpushare reads a node (``core.model.inventory``, ``core.model.disabling``,
``core.model.topology``,
``core.records.handoff``, ``core.placement.preferences``, ``core.resourcepolicies.policybook``)."""

_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([10**400, -(10**30), 2**63, -1, 0]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(HOSTILE_STRINGS),
    st.text(max_size=8),
)
hostile_values = st.recursive(
    _leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(["", "a", "key", "values", "index"]), inner, max_size=3),
    ),
    max_leaves=6,
)
"""Any JSON value (and a few Python values JSON cannot carry, such as NaN and huge ints)."""


def put(obj: dict[str, Any], path: Path, value: Any) -> dict[str, Any]:
    """A deep copy of ``obj`` with ``value`` at ``path``, making what is missing on the way."""
    out = copy.deepcopy(obj)
    here: Any = out
    for step, after in itertools.pairwise(path):
        fresh: Any = [{}] if isinstance(after, int) else {}
        if isinstance(step, int):
            if not isinstance(here, list):
                return out
            while len(here) <= step:
                here.append(fresh)
            if not isinstance(here[step], dict | list):
                here[step] = fresh
        else:
            if not isinstance(here, dict):
                return out
            if not isinstance(here.get(step), dict | list):
                here[step] = fresh
        here = here[step]
    last = path[-1]
    if isinstance(last, int) and isinstance(here, list):
        while len(here) <= last:
            here.append({})
        here[last] = value
    elif isinstance(last, str) and isinstance(here, dict):
        here[last] = value
    return out


def mutations(paths: tuple[Path, ...]) -> st.SearchStrategy[list[tuple[Path, Any]]]:
    """One to three (path, hostile value) changes."""
    return st.lists(st.tuples(st.sampled_from(paths), hostile_values), min_size=1, max_size=3)


def mutated(obj: dict[str, Any], changes: list[tuple[Path, Any]]) -> dict[str, Any]:
    """``obj`` with every change applied in order."""
    for path, value in changes:
        obj = put(obj, path, value)
    return obj
