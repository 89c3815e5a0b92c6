"""How this node's GPUs are connected, read from NVML into ``core.model.topology``'s distances.

Two facts per pair of GPUs, from nvidia-ml-py (``pynvml``):

- NVLink: for each link ``0..NVML_NVLINK_MAX_LINKS-1`` of a GPU, ``nvmlDeviceGetNvLinkState``
  says whether it is active (``NVML_FEATURE_ENABLED``) and ``nvmlDeviceGetNvLinkRemotePciInfo``
  which PCI device is at its other end. A link whose far end is another GPU's bus ID joins the
  two. On an NVSwitch box the far end is a switch, not a GPU
  (``nvmlDeviceGetNvLinkRemoteDeviceType`` = ``NVML_NVLINK_DEVICE_TYPE_SWITCH``): every GPU
  with an active link to a switch reaches every other such GPU over NVLink. A GPU without
  NVLink answers ``NVMLError`` (``NVML_ERROR_NOT_SUPPORTED``, or ``INVALID_ARGUMENT`` past its
  last link); that means no link, not a failure.
- PCIe: ``nvmlDeviceGetTopologyCommonAncestor`` gives the closest common ancestor of the pair,
  one of ``NVML_TOPOLOGY_INTERNAL`` (0), ``SINGLE`` (10, one PCIe switch), ``MULTIPLE`` (20,
  several switches), ``HOSTBRIDGE`` (30), ``NODE`` (40, the same NUMA node) and ``SYSTEM`` (50,
  across NUMA nodes), the levels ``nvidia-smi topo -m`` prints as PIX, PXB, PHB, NODE and SYS.

A pair with NVLink is at distance 1 whatever its PCIe path; the others at their PCIe level's
distance (``PCIE_DISTANCE``). The count of links is kept for the log; version 1 of the
annotation has no place for bandwidth. Should NVML refuse the PCIe question for any pair the
node publishes no topology at all, with the reason: a matrix with guessed entries would steer
pods with false confidence, and without one the node is placed as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

from gpushare.core.model.topology import (
    CROSS_NUMA,
    HOST_BRIDGE,
    NUMA_NODE,
    NVLINK,
    PCIE_SWITCH,
    PCIE_SWITCHES,
    SAME,
    Distance,
    check_distance,
)

PCIE_DISTANCE = {
    0: PCIE_SWITCH,  # NVML_TOPOLOGY_INTERNAL: two GPUs of one board, behind its own switch
    10: PCIE_SWITCH,  # NVML_TOPOLOGY_SINGLE
    20: PCIE_SWITCHES,  # NVML_TOPOLOGY_MULTIPLE
    30: HOST_BRIDGE,  # NVML_TOPOLOGY_HOSTBRIDGE
    40: NUMA_NODE,  # NVML_TOPOLOGY_NODE (NVML_TOPOLOGY_CPU in older headers)
    50: CROSS_NUMA,  # NVML_TOPOLOGY_SYSTEM
}
"""NVML's ``nvmlGpuTopologyLevel_t`` values to ``core.model.topology`` distances; a level NVML adds
later counts as the farthest, which only ever makes the scheduler more cautious."""

SWITCH_DEVICE_TYPE = 2
"""``NVML_NVLINK_DEVICE_TYPE_SWITCH``, the far end of a link on an NVSwitch box."""


@dataclass(frozen=True)
class Interconnect:
    """What NVML said: the matrix (or () and why not), and NVLink links per pair."""

    distance: Distance = ()
    links: dict[tuple[int, int], int] = field(default_factory=dict)
    """Active NVLink links between positions (i, j), i < j; 0 or absent: none."""
    problem: str = ""


def bus_id(pci: Any) -> str:
    """A PCI address as ``domain:bus:device.function`` in lower-case hex, without padding.

    ``nvmlDeviceGetPciInfo`` and the remote PCI info of a link spell the domain with 8 or 4
    digits depending on the structure's version; comparing the numbers avoids that.
    """
    raw = getattr(pci, "busId", pci)
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    text = text.strip().rstrip("\x00").lower()
    head, _, function = text.rpartition(".")
    parts = head.split(":")
    try:
        numbers = [int(p, 16) for p in parts] + [int(function, 16)]
    except ValueError:
        return text
    if len(numbers) == 3:
        numbers.insert(0, 0)  # no domain: domain 0
    if len(numbers) != 4:
        return text
    domain, bus, device, fn = numbers
    return f"{domain:x}:{bus:x}:{device:x}.{fn:x}"


def _active_links(nvml: Any, handle: Any) -> list[int]:
    """This GPU's links that NVML reports active; none when it has no NVLink."""
    active: list[int] = []
    for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except nvml.NVMLError:
            continue  # not supported on this GPU, or past its last link
        if state == getattr(nvml, "NVML_FEATURE_ENABLED", 1):
            active.append(link)
    return active


def _to_switch(nvml: Any, handle: Any, link: int) -> bool:
    try:
        kind = nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
    except (nvml.NVMLError, AttributeError):
        return False
    return bool(kind == getattr(nvml, "NVML_NVLINK_DEVICE_TYPE_SWITCH", SWITCH_DEVICE_TYPE))


def nvlinks(nvml: Any, handles: Sequence[Any]) -> dict[tuple[int, int], int]:
    """Active NVLink links between each pair of ``handles`` positions (i < j)."""
    position: dict[str, int] = {}
    for i, handle in enumerate(handles):
        try:
            position[bus_id(nvml.nvmlDeviceGetPciInfo(handle))] = i
        except nvml.NVMLError:
            continue
    direct: dict[tuple[int, int], int] = {}
    switched: dict[int, int] = {}
    for i, handle in enumerate(handles):
        for link in _active_links(nvml, handle):
            try:
                remote = bus_id(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link))
            except nvml.NVMLError:
                continue
            j = position.get(remote)
            if j is not None and j != i:
                key = (min(i, j), max(i, j))
                # each link is seen from both ends: count it from the lower index only
                if i < j:
                    direct[key] = direct.get(key, 0) + 1
                else:
                    direct.setdefault(key, 0)
            elif j is None and _to_switch(nvml, handle, link):
                switched[i] = switched.get(i, 0) + 1
    links = {pair: count for pair, count in direct.items() if count}
    for i, j in combinations(sorted(switched), 2):
        links[(i, j)] = links.get((i, j), 0) + min(switched[i], switched[j])
    return links


def read_interconnect(nvml: Any, handles: Sequence[Any]) -> Interconnect:
    """The distance matrix of the GPUs behind ``handles`` (index order), from NVML."""
    count = len(handles)
    if count < 2:
        return Interconnect()
    links = nvlinks(nvml, handles)
    rows = [[SAME] * count for _ in range(count)]
    for i, j in combinations(range(count), 2):
        if links.get((i, j)):
            rows[i][j] = rows[j][i] = NVLINK
            continue
        try:
            level = int(nvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j]))
        except nvml.NVMLError as err:
            return Interconnect(
                links=links,
                problem=(
                    f"nvmlDeviceGetTopologyCommonAncestor(GPU {i}, GPU {j}) failed ({err}); "
                    f"the node publishes no topology and multi-GPU pods keep the packing order"
                ),
            )
        rows[i][j] = rows[j][i] = PCIE_DISTANCE.get(level, CROSS_NUMA)
    distance, problem = check_distance(rows, count)
    return Interconnect(distance=distance, links=links, problem=problem)
