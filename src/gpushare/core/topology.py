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

from gpushare.core.names import ANN_NODE_TOPOLOGY

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


def parse_topology(text: str, *, node: str, gpus: int) -> tuple[Distance, str]:
    """The distance matrix, or () and a problem naming the annotation, value and rule."""
    hint = f"node {node}: annotation {ANN_NODE_TOPOLOGY}"
    rule = (
        f'must be {{"version": {TOPOLOGY_VERSION}, "distance": [[...], ...]}}, a symmetric '
        f"{gpus}x{gpus} matrix of integers 1..{max(LINKS)} with 0 on the diagonal; the device "
        f"plugin writes it, so restart it"
    )
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        return (), f"{hint} is not JSON ({err.msg}); it {rule}"
    if not isinstance(raw, Mapping):
        return (), f"{hint}={text[:80]!r} {rule}"
    if raw.get("version") != TOPOLOGY_VERSION:
        return (), f"{hint}: version {raw.get('version')!r} is not known; it {rule}"
    rows = raw.get("distance")
    if not isinstance(rows, list) or len(rows) != gpus:
        return (), f"{hint}: distance has {_size(rows)} rows for {gpus} GPUs; it {rule}"
    matrix: list[tuple[int, ...]] = []
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != gpus:
            return (), f"{hint}: distance[{i}] has {_size(row)} entries; it {rule}"
        for j, value in enumerate(row):
            valid = isinstance(value, int) and not isinstance(value, bool)
            if not valid or value not in LINKS or (value == 0) != (i == j):
                return (), f"{hint}: distance[{i}][{j}]={value!r}; it {rule}"
        matrix.append(tuple(row))
    for i in range(gpus):
        for j in range(i):
            if matrix[i][j] != matrix[j][i]:
                return (), (
                    f"{hint}: distance[{i}][{j}]={matrix[i][j]} but distance[{j}][{i}]="
                    f"{matrix[j][i]}; it {rule}"
                )
    return tuple(matrix), ""


def _size(value: object) -> int:
    return len(value) if isinstance(value, list) else 0


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
