"""How a node's GPUs are connected, and the best-connected set for a multi-GPU pod.

The device plugin reads the interconnect from NVML (NVLink state, and the PCIe common ancestor
of each pair) and writes it beside the inventory as ``gpushare.io/gpu-topology``::

    {"version": 1, "distance": [[0, 1, 5], [1, 0, 5], [5, 5, 0]]}

``distance[i][j]`` is the link between the i-th and j-th GPU of ``gpushare.io/gpus`` (index
order), one of ``LINKS``: lower is closer. A pod over several GPUs (``aliyun.com/gpu-count``)
talks between them, so among the sets of GPUs it fits on, the one whose worst pair is closest
wins, then the smallest sum over pairs; equal sets keep the packing order (best fit, or most
free on ``spread`` nodes), so on a node without topology, or one where all GPUs are equally
connected, the choice is exactly the one placement alone makes.

The format carries a version so a later one can add bandwidth; a reader refuses versions it
does not know rather than guess. A malformed value is not fatal: topology only orders choices
that are all valid, so the node is placed without it and the problem is kept for ``inspect``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from itertools import combinations

from gpushare.core.model.kubejson import embedded_json
from gpushare.core.model.names import ANN_NODE_TOPOLOGY

TOPOLOGY_VERSION = 1

LINKS = {
    0: "same GPU",
    1: "NVLink",
    2: "one PCIe switch",
    3: "several PCIe switches",
    4: "PCIe host bridge",
    5: "same NUMA node",
    6: "across NUMA nodes",
}
"""Distances, closest first; 2..6 follow NVML's topology levels (PIX, PXB, PHB, NODE, SYS)."""

MAX_SEARCH_GPUS = 16
"""Above this many fitting GPUs the search keeps the packing order (C(16, 8) = 12,870 sets)."""

Distance = tuple[tuple[int, ...], ...]


SAME, NVLINK, PCIE_SWITCH, PCIE_SWITCHES, HOST_BRIDGE, NUMA_NODE, CROSS_NUMA = range(7)
"""``LINKS`` by name, for the readers of NVML and the builders of made-up topologies."""


def _rule(gpus: int) -> str:
    return f"a symmetric {gpus}x{gpus} matrix of integers 1..{max(LINKS)} with 0 on the diagonal"


def check_distance(rows: object, gpus: int) -> tuple[Distance, str]:
    """The matrix, or () and what is wrong with it (the entry, its value, the rule).

    The one check every source of a matrix goes through: the annotation's reader, the fake
    backend's flag and the simulator's layouts.
    """
    rule = _rule(gpus)
    if not isinstance(rows, list | tuple) or len(rows) != gpus:
        return (), f"distance has {_size(rows)} rows for {gpus} GPUs; it must be {rule}"
    matrix: list[tuple[int, ...]] = []
    for i, row in enumerate(rows):
        if not isinstance(row, list | tuple) or len(row) != gpus:
            return (), f"distance[{i}] has {_size(row)} entries; it must be {rule}"
        for j, value in enumerate(row):
            valid = isinstance(value, int) and not isinstance(value, bool)
            if not valid or value not in LINKS or (value == 0) != (i == j):
                return (), f"distance[{i}][{j}]={value!r}; it must be {rule}"
        matrix.append(tuple(row))
    for i in range(gpus):
        for j in range(i):
            if matrix[i][j] != matrix[j][i]:
                return (), (
                    f"distance[{i}][{j}]={matrix[i][j]} but distance[{j}][{i}]="
                    f"{matrix[j][i]}; it must be {rule}"
                )
    return tuple(matrix), ""


def parse_topology(text: str, *, node: str, gpus: int) -> tuple[Distance, str]:
    """The distance matrix, or () and a problem naming the annotation, value and rule."""
    hint = f"node {node}: annotation {ANN_NODE_TOPOLOGY}"
    rule = (
        f'must be {{"version": {TOPOLOGY_VERSION}, "distance": [[...], ...]}}, '
        f"{_rule(gpus)}; the device plugin writes it, so restart it"
    )
    raw, problem = embedded_json(text)
    if problem:
        return (), f"{hint} {problem}; it {rule}"
    if not isinstance(raw, Mapping):
        return (), f"{hint}={text[:80]!r} {rule}"
    if raw.get("version") != TOPOLOGY_VERSION:
        return (), f"{hint}: version {raw.get('version')!r} is not known; it {rule}"
    matrix, problem = check_distance(raw.get("distance"), gpus)
    if problem:
        what = problem.split("; it must be ")[0]
        return (), f"{hint}: {what}; it {rule}"
    return matrix, ""


def _size(value: object) -> int:
    return len(value) if isinstance(value, list | tuple) else 0


def islands(gpus: int, size: int, *, between: int = CROSS_NUMA) -> Distance:
    """``gpus`` GPUs in NVLink islands of ``size`` consecutive indexes, ``between`` apart.

    The shapes of common boxes: ``size`` = ``gpus`` is an NVSwitch box (every pair NVLink),
    2 is NVLink bridges on pairs of PCIe cards, 4 is two NVLink islands of four.
    """
    return tuple(
        tuple(
            SAME if i == j else NVLINK if i // size == j // size else between for j in range(gpus)
        )
        for i in range(gpus)
    )


LAYOUTS = {
    "nvswitch": "every pair NVLink (an NVSwitch box)",
    "nvlink-pairs": "GPUs 0-1, 2-3, ... NVLink bridged, other pairs across NUMA nodes",
    "nvlink-islands": "two NVLink islands (the lower and upper half), across NUMA nodes between",
    "pcie": "every pair under one PCIe host bridge, no NVLink",
}
"""Named layouts a made-up node can take (``layout``)."""


def layout(spec: str, gpus: int) -> tuple[Distance, str]:
    """The matrix a layout name or an explicit matrix describes, or () and what is wrong.

    ``spec`` is a name of ``LAYOUTS`` or the rows of a matrix, rows separated by ``;`` and
    entries by ``,`` (``0,1;1,0``). The problem names the value and the rule, so the caller
    only adds which setting it came from.
    """
    text = spec.replace(" ", "")
    names = ", ".join(LAYOUTS)
    if not text:
        return (), f"{spec!r} is empty; write one of {names} or a matrix like 0,1;1,0"
    if text in LAYOUTS:
        if text == "nvlink-pairs" and gpus % 2:
            return (), f"{spec!r} needs an even number of GPUs, not {gpus}"
        if text == "nvlink-islands" and (gpus < 2 or gpus % 2):
            return (), f"{spec!r} needs an even number of GPUs (two halves), not {gpus}"
        size = {"nvswitch": gpus, "nvlink-pairs": 2, "nvlink-islands": gpus // 2}.get(text)
        if size is None:
            return islands(gpus, 1, between=HOST_BRIDGE), ""
        return islands(gpus, max(size, 1)), ""
    if not all(c in "0123456789,;" for c in text):
        return (), (
            f"{spec!r} is neither a layout ({names}) nor a matrix of digits, entries "
            f"separated by ',' and rows by ';' (0,1;1,0)"
        )
    rows = [[int(v) if v else -1 for v in row.split(",")] for row in text.split(";")]
    matrix, problem = check_distance(rows, gpus)
    return matrix, f"{spec!r}: {problem}" if problem else ""


def topology_annotation(distance: Sequence[Sequence[int]]) -> str:
    """Encode a distance matrix as the device plugin writes it."""
    return json.dumps(
        {"version": TOPOLOGY_VERSION, "distance": [list(row) for row in distance]},
        separators=(",", ":"),
    )


def closest_set(
    ranked: Sequence[int], count: int, distance: Distance, position: Mapping[int, int]
) -> tuple[int, ...]:
    """The ``count`` GPUs among ``ranked`` (packing order, best first) that are best connected.

    ``position`` maps a GPU index to its row in ``distance``. The key is (worst pair, sum over
    pairs, the set's places in the packing order), so ties keep the packing choice.
    """
    if len(ranked) > MAX_SEARCH_GPUS or count < 2:
        return tuple(sorted(ranked[:count]))

    def key(chosen: tuple[int, ...]) -> tuple[int, int, tuple[int, ...]]:
        pairs = [distance[position[a]][position[b]] for a, b in combinations(chosen, 2)]
        return (max(pairs), sum(pairs), tuple(ranked.index(g) for g in chosen))

    best = min(combinations(ranked, count), key=key)
    return tuple(sorted(best))


def worst_pair(chosen: Sequence[int], distance: Distance) -> int:
    """The farthest link between any two of ``chosen`` (rows of ``distance``); 0 for one GPU."""
    return max((distance[a][b] for a, b in combinations(chosen, 2)), default=SAME)


def best_worst_pair(distance: Distance, count: int) -> int:
    """The closest worst pair any ``count`` GPUs of the node can have, all of them free.

    A set that reaches it is as well connected as the node allows: the measure the simulator
    reports for multi-GPU pods (``sim.milligpu``, ``sim.gpumem``).
    """
    if count < 2 or count > len(distance):
        return SAME
    return min(worst_pair(c, distance) for c in combinations(range(len(distance)), count))
