"""A pod's allocation and its annotations: the only record of who holds what.

The ledger is rebuilt from these annotations alone, so a restart of the extender loses nothing.
gpushare writes its own annotation (``gpushare.io/allocation``: per-container, per-GPU amounts
and the unit) plus the predecessor's five ``ALIYUN_COM_GPU_MEM_*`` keys, so existing device
plugins and tools keep working. Pods placed by the predecessor alone are read back from its keys.

Splitting a pod over N GPUs gives every container a share of each of the pod's GPUs, the same
for containers of equal size, which the hand-off needs (core.model.spreading chooses them); the pod
holds on each GPU what its containers' shares there add up to, counted as Kubernetes counts a
pod (init containers run before the others and reuse the same memory).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated

import msgspec

from gpushare.core.model.containers import ContainerKind
from gpushare.core.model.kubejson import (
    KubeObject,
    annotations_of,
    name_of,
    namespace_of,
    node_name_of,
    uid_of,
    whole_number,
)
from gpushare.core.model.names import (
    ANN_ALLOCATION,
    ANN_ASSIGNED,
    ANN_ASSUME_TIME,
    ANN_DEV,
    ANN_IDX,
    ANN_POD,
)
from gpushare.core.model.requests import PodRequest
from gpushare.core.model.units import MemoryUnit

FORMAT_VERSION = 1


@dataclass(frozen=True)
class GpuShare:
    """An amount held on one GPU."""

    index: int
    mem_units: int
    core_pct: int = 0


@dataclass(frozen=True)
class ContainerShare:
    """What one container is served from, GPU by GPU."""

    name: str
    kind: ContainerKind
    gpus: tuple[GpuShare, ...]

    @property
    def mem_units(self) -> int:
        """The container's memory over all its GPUs."""
        return sum(share.mem_units for share in self.gpus)

    @property
    def core_pct(self) -> int:
        """The container's computing power over all its GPUs."""
        return sum(share.core_pct for share in self.gpus)


@dataclass(frozen=True)
class Allocation:
    """Who holds what on which GPUs of one node."""

    uid: str
    namespace: str
    name: str
    node: str
    unit: MemoryUnit
    gpus: tuple[GpuShare, ...]
    """The pod's holding per GPU (even, unless equal containers cannot split evenly)."""
    containers: tuple[ContainerShare, ...] = ()
    assigned: bool = False
    """True once the device plugin has served the pod."""
    assume_time_ns: int = 0

    @property
    def key(self) -> str:
        """``namespace/name`` for messages."""
        return f"{self.namespace}/{self.name}"

    @property
    def mem_units(self) -> int:
        """The pod's memory over all its GPUs."""
        return sum(share.mem_units for share in self.gpus)

    @property
    def core_pct(self) -> int:
        """The pod's computing power over all its GPUs."""
        return sum(share.core_pct for share in self.gpus)

    @property
    def indexes(self) -> tuple[int, ...]:
        """The GPU indexes the pod holds."""
        return tuple(share.index for share in self.gpus)

    def same_placement(self, other: Allocation) -> bool:
        """Whether both put the pod on the same node with the same per-GPU amounts."""
        return self.node == other.node and self.gpus == other.gpus


def plan(
    request: PodRequest,
    *,
    node: str,
    indexes: Sequence[int],
    unit: MemoryUnit,
    assume_time_ns: int = 0,
) -> Allocation:
    """Split a valid request over the chosen GPUs of a node, position by position."""
    if len(indexes) != request.gpu_count:
        raise ValueError(f"pod {request.key} needs {request.gpu_count} GPUs, got {list(indexes)}")
    gpus = tuple(
        GpuShare(index=i, mem_units=m, core_pct=c)
        for i, m, c in zip(indexes, request.mem_holding, request.core_holding, strict=True)
    )
    containers = tuple(
        ContainerShare(
            name=container.name,
            kind=container.kind,
            gpus=tuple(
                GpuShare(index=i, mem_units=m, core_pct=c)
                for i, m, c in zip(indexes, mem, core, strict=True)
            ),
        )
        for container, mem, core in zip(
            request.containers, request.mem_layouts, request.core_layouts, strict=True
        )
    )
    return Allocation(
        uid=request.uid,
        namespace=request.namespace,
        name=request.name,
        node=node,
        unit=unit,
        gpus=gpus,
        containers=containers,
        assume_time_ns=assume_time_ns,
    )


class _ShareRecord(msgspec.Struct, kw_only=True):
    """One GPU's share in the record; the field names are the annotation's."""

    index: Annotated[int, msgspec.Meta(ge=0)]
    mem: Annotated[int, msgspec.Meta(ge=0)]
    core: Annotated[int, msgspec.Meta(ge=0)] = 0

    @classmethod
    def of(cls, share: GpuShare) -> _ShareRecord:
        return cls(index=share.index, mem=share.mem_units, core=share.core_pct)

    def share(self) -> GpuShare:
        return GpuShare(index=self.index, mem_units=self.mem, core_pct=self.core)


class _ContainerRecord(msgspec.Struct, kw_only=True):
    name: str = ""
    kind: ContainerKind = ContainerKind.APP
    gpus: list[_ShareRecord]


class _Record(msgspec.Struct, kw_only=True):
    """``ANN_ALLOCATION``: the record bind writes and every reader decodes (fields in the order
    they are written, so the text, which the seal covers, does not change)."""

    version: int = FORMAT_VERSION
    node: str
    unit: str = "1GiB"
    gpus: list[_ShareRecord]
    containers: list[_ContainerRecord] = msgspec.field(default_factory=list)


_read_record = msgspec.json.Decoder(_Record).decode


class RecordError(ValueError):
    """An ``ANN_ALLOCATION`` that is not the record; the message names the field
    (``gpus[0].mem: Expected `int` >= 0, got `-1```)."""


def read_record(text: str) -> _Record:
    """Decode the record, or ``RecordError`` naming where it breaks the format."""
    try:
        return _read_record(text)
    except msgspec.ValidationError as err:
        message, _, where = str(err).partition(" - at `$")
        raise RecordError(f"{where.rstrip('`').lstrip('.') or 'record'}: {message}") from err
    except msgspec.DecodeError as err:
        raise RecordError(f"not JSON: {err}") from err


def to_annotations(allocation: Allocation, *, dev_units: int) -> dict[str, str]:
    """The annotations bind writes: gpushare's own record and the predecessor's keys.

    ``dev_units`` is the memory of one GPU on the node, for ``ALIYUN_COM_GPU_MEM_DEV``.
    """
    record = _Record(
        node=allocation.node,
        unit=allocation.unit.value,
        gpus=[_ShareRecord.of(s) for s in allocation.gpus],
        containers=[
            _ContainerRecord(name=c.name, kind=c.kind, gpus=[_ShareRecord.of(s) for s in c.gpus])
            for c in allocation.containers
        ],
    )
    return {
        ANN_ALLOCATION: msgspec.json.encode(record).decode(),
        ANN_IDX: ",".join(str(i) for i in allocation.indexes),
        ANN_POD: str(allocation.mem_units),
        ANN_DEV: str(dev_units),
        ANN_ASSIGNED: "true" if allocation.assigned else "false",
        ANN_ASSUME_TIME: str(allocation.assume_time_ns),
    }


def _int_annotation(annotations: Mapping[str, str], key: str) -> int:
    return whole_number(annotations.get(key, "")) or 0


def from_pod(pod: KubeObject) -> Allocation | None:
    """Read a pod's allocation from its annotations; None when it carries none.

    gpushare's own record wins; the predecessor's keys are the fallback. An unreadable record
    also returns None, and the ledger then treats the pod's memory as held on an unknown GPU.
    """
    annotations = annotations_of(pod)
    assigned = str(annotations.get(ANN_ASSIGNED, "")).lower() == "true"
    assume = _int_annotation(annotations, ANN_ASSUME_TIME)
    uid, namespace, name = uid_of(pod), namespace_of(pod), name_of(pod)
    if ANN_ALLOCATION in annotations:
        try:
            record = read_record(str(annotations[ANN_ALLOCATION]))
            return Allocation(
                node=record.node,
                unit=MemoryUnit.parse(record.unit),
                gpus=tuple(s.share() for s in record.gpus),
                containers=tuple(
                    ContainerShare(name=c.name, kind=c.kind, gpus=tuple(s.share() for s in c.gpus))
                    for c in record.containers
                ),
                uid=uid,
                namespace=namespace,
                name=name,
                assigned=assigned,
                assume_time_ns=assume,
            )
        except ValueError:  # RecordError, or a unit MemoryUnit does not know
            return None
    node = node_name_of(pod)
    idx_text = str(annotations.get(ANN_IDX, "")).strip()
    if not node or not idx_text or ANN_POD not in annotations:
        return None
    read = [whole_number(p) for p in idx_text.split(",")]
    indexes = [i for i in read if i is not None]
    if len(indexes) != len(read):
        return None
    total = _int_annotation(annotations, ANN_POD)
    each = total // len(indexes)
    return Allocation(
        node=node,
        unit=MemoryUnit.GiB,
        gpus=tuple(GpuShare(index=i, mem_units=each) for i in indexes),
        uid=uid,
        namespace=namespace,
        name=name,
        assigned=assigned,
        assume_time_ns=assume,
    )
