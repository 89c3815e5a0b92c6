"""Reading the openb trace format (Alibaba GPU cluster trace v2023, the FGD paper's data).

Node list: ``sn,cpu_milli,memory_mib,gpu,model``. Pod list: ``name,cpu_milli,memory_mib,num_gpu,
gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time``. ``gpu_milli`` is
thousandths of one GPU, per GPU; ``gpu_spec`` lists allowed models separated by ``|`` (empty =
any). A malformed row is an error naming the file, the line, the field and the value.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

MILLI_PER_GPU = 1000


class TraceError(ValueError):
    """A trace file that cannot be read, with the place and the reason."""


@dataclass(frozen=True)
class TraceNode:
    """One GPU node of the trace."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str
    gpu_mem_mib: int = 0
    """Memory of one GPU when the input says it (Kubernetes YAML); 0: look the model up."""
    mode: str = ""
    """The node's ``ack.node.gpu.schedule`` label when the input has one (memory mode)."""


@dataclass(frozen=True)
class TracePod:
    """One pod of the trace (qos and phase are not used; the paper's protocol ignores times)."""

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: tuple[str, ...] = ()
    gpu_mem_mib: int = 0
    """Memory per GPU when the pod asked in memory (Kubernetes YAML); memory mode asks for
    exactly that instead of converting ``gpu_milli`` back, which would round up twice."""
    gpu_core_pct: int = 0
    """Computing power per GPU when the pod asked for it (Kubernetes YAML)."""
    duration_s: int = field(default=0, repr=False)
    """How long the pod ran in the trace (deletion less creation time, seconds; 0 when the
    input does not say). Only the churn protocol (``sim.churn``) reads it; left out of the
    repr, which digests of generated workloads are taken over."""

    @property
    def gpu_request_milli(self) -> int:
        """Total GPU request in milli-GPU (num_gpu x gpu_milli)."""
        return self.num_gpu * self.gpu_milli

    @property
    def shape(self) -> tuple[int, int, int, tuple[str, ...]]:
        """What FGD's target workload groups pods by."""
        return (self.cpu_milli, self.gpu_milli, self.num_gpu, self.gpu_spec)


def _int(row: dict[str, str], key: str, where: str) -> int:
    value = (row.get(key) or "").strip()
    try:
        number = int(float(value)) if value else 0
    except ValueError:
        raise TraceError(f"{where}: {key}={value!r} is not a number") from None
    if number < 0:
        raise TraceError(f"{where}: {key}={value!r} is negative")
    return number


def _rows(path: Path, required: tuple[str, ...]) -> list[tuple[str, dict[str, str]]]:
    try:
        handle = path.open(newline="")
    except OSError as err:
        raise TraceError(f"cannot open {path}: {err.strerror}") from None
    with handle:
        reader = csv.DictReader(handle)
        missing = [c for c in required if c not in (reader.fieldnames or [])]
        if missing:
            raise TraceError(f"{path}: header lacks column(s) {', '.join(missing)}")
        return [(f"{path.name}:{i + 2}", row) for i, row in enumerate(reader)]


def read_nodes(path: Path) -> list[TraceNode]:
    """The node list, in file order."""
    nodes = []
    for where, row in _rows(path, ("sn", "cpu_milli", "memory_mib", "gpu", "model")):
        nodes.append(
            TraceNode(
                name=row["sn"],
                cpu_milli=_int(row, "cpu_milli", where),
                memory_mib=_int(row, "memory_mib", where),
                gpus=_int(row, "gpu", where),
                model=(row.get("model") or "").strip(),
            )
        )
    return nodes


def read_pods(path: Path) -> list[TracePod]:
    """The pod list, in file order."""
    pods = []
    for where, row in _rows(path, ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")):
        num_gpu = _int(row, "num_gpu", where)
        gpu_milli = _int(row, "gpu_milli", where)
        if gpu_milli > MILLI_PER_GPU:
            raise TraceError(f"{where}: gpu_milli={gpu_milli} is more than one GPU (1000)")
        spec = tuple(s for s in (row.get("gpu_spec") or "").split("|") if s)
        pods.append(
            TracePod(
                name=row["name"],
                cpu_milli=_int(row, "cpu_milli", where),
                memory_mib=_int(row, "memory_mib", where),
                num_gpu=num_gpu,
                gpu_milli=gpu_milli if num_gpu else 0,
                gpu_spec=spec,
                duration_s=_duration(row, where),
            )
        )
    return pods


def _duration(row: dict[str, str], where: str) -> int:
    """Deletion less creation time, when the row has both (0 otherwise)."""
    if not (row.get("creation_time") or "").strip() or not (row.get("deletion_time") or "").strip():
        return 0
    created = _int(row, "creation_time", where)
    deleted = _int(row, "deletion_time", where)
    return max(0, deleted - created)
