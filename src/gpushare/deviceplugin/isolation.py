"""Isolation hooks: what Allocate adds to a container so that its GPU share is enforced.

One hook per node mode (``ack.node.gpu.schedule``), picked when the plugin starts:

- ``cgpu`` and ``core_mem``: :class:`InterposerIsolation` preloads the native interposer
  (``gpushare/isolation/native``) and gives each container its memory limit in bytes per visible
  GPU, its SM percentage on core_mem, and an account of its own in the plugin's accounting
  broker (``deviceplugin.broker``), through which the interposer counts usage across the
  container's processes.
- ``mps``: :class:`MpsIsolation` runs one NVIDIA MPS control daemon per GPU and points each
  container at its GPU's pipe directory, with MPS's own pinned-memory limit.
- ``share`` (and ``--isolation none``): :class:`~gpushare.deviceplugin.serving.NoIsolation`; the
  container gets the ``ALIYUN_COM_GPU_MEM_*`` variables only and limits itself
  (``gpushare.isolation.share``).

What the container cannot undo: the limits and the preload are files the plugin writes on the
host and mounts read-only, ``/etc/gpushare/limits`` (``gpushare.isolation.limits``; the
interposer reads it before the environment) and ``/etc/ld.so.preload`` (glibc's loader reads it
for every dynamically linked program, setuid ones included, whatever ``LD_PRELOAD`` says), so
neither a pod's own ``env`` nor a process that clears its children's environment turns the
limits off. The variables stay, for people. Usage is not the container's to write either: it is
kept by the broker, behind a socket whose directory is mounted read-only; each process's
connection is its account, given back when the process ends.

Mount sources are host paths: kubelet reads them on the host. The plugin creates the broker's
sockets and the pipe directories and copies the library through its own mounts, so the state
and library directories must be mounted at the same path in the plugin's container (the chart
does so).

Kubelet calls Allocate once per container and resource, and merges the answers: on core_mem
nodes the memory answer carries everything, so that the mounts are not given twice.

Kubelet does not say which pod it admits. When one pending container has the signature its
broker socket is ``<state>/broker/<pod-uid>/<container>/broker.sock`` (and its limits
``<state>/limits/<pod-uid>/<container>/limits``); when several identical ones wait, they are
named after kubelet's device IDs, which no two live containers share. Each Allocate starts the
account empty (kubelet calls it once per container, not on restarts); the plugin's PodResources
check closes the accounts and removes the directories of pods that are gone and of device sets
no longer in use, once they are a minute old. A restarted plugin serves every account again
from the limits files.

The MPS daemon commands run inside Allocate (which kubelet awaits anyway): at most one start per
GPU, and one liveness probe per container.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import subprocess
import time
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Protocol

from gpushare.core.handoff import MEM, Signature
from gpushare.core.inventory import CORE_PER_GPU, Mode
from gpushare.core.isolationpaths import (
    CONTAINER_BROKER_DIR,
    CONTAINER_LIB_DIR,
    CONTAINER_LIMITS_FILE,
    CONTAINER_MPS_PIPE_DIR,
    CONTAINER_PRELOAD_FILE,
    CONTAINER_SCHED_DIR,
)
from gpushare.core.units import MemoryUnit
from gpushare.deviceplugin.broker import CONTAINER_BROKER_SOCKET, SETTLE_S, Broker
from gpushare.deviceplugin.config import BrokerStats
from gpushare.deviceplugin.descriptors import BrokerCaps
from gpushare.deviceplugin.gpus import GpuInfo, GpuSource
from gpushare.deviceplugin.serving import (
    ContainerAnswer,
    IsolationError,
    IsolationHook,
    NoIsolation,
    Target,
)
from gpushare.deviceplugin.usage import ContainerUse, Owner, read_owner, write_owner
from gpushare.isolation.build import LIB_NAME
from gpushare.isolation.limits import (
    LIMITS_FILE_NAME,
    ContainerLimits,
    mem_limit_text,
)
from gpushare.isolation.policy import (
    IDLE_AFTER_S,
    Member,
    Policy,
    own_share_pct,
    schedule,
    slot_id,
)

log = logging.getLogger(__name__)

DEFAULT_LIB_DIR = Path("/usr/local/gpushare")
PRELOAD_NAME = "ld.so.preload"
"""The host file, in the library directory, that containers see as /etc/ld.so.preload."""
POLICIES = ("auto", "none")
BY_DEVICES = "by-devices"
PRUNE_GRACE_S = 60.0
"""Per-container directories younger than this are kept: the live lists may predate them."""
PER_CONTAINER = ("broker", "limits", "accounting")
"""The state directory's per-container kinds (``accounting``: usage tables of older plugins)."""
SCHED = "sched"
"""The state directory's per-GPU schedule files (cGPU policies 0..4), ``gpu<index>``."""
BY_ACTIVITY = (Policy.PREEMPTIVE, Policy.WEIGHTED, Policy.SOFT)
"""Policies whose shares go to the containers active on the GPU now."""


def packaged_library() -> Path | None:
    """The interposer built into this package, if the build produced it."""
    try:
        path = Path(str(resources.files("gpushare.isolation") / "native" / LIB_NAME))
    except ModuleNotFoundError:
        return None
    return path if path.is_file() else None


def install_library(source: Path | None, lib_dir: Path) -> str:
    """Copy the library into ``lib_dir`` (atomically); the reason it is unusable, or ""."""
    target = lib_dir / LIB_NAME
    if source is None:
        if target.is_file():
            log.warning("no packaged %s; serving the one already in %s", LIB_NAME, lib_dir)
            return ""
        return (
            f"isolation needs the interposer library {LIB_NAME}, but this gpushare package has "
            f"none (gpushare/isolation/native/{LIB_NAME}) and {lib_dir} has none either: build "
            f"it (python -m gpushare.isolation.build, or the image), or start with "
            f"--isolation none to serve this node without isolation"
        )
    try:
        lib_dir.mkdir(parents=True, exist_ok=True)
        tmp = lib_dir / f".{LIB_NAME}.tmp"
        shutil.copyfile(source, tmp)
        tmp.chmod(0o755)
        # a rename: running containers keep the file they mapped
        tmp.replace(target)
    except OSError as err:
        return f"cannot install {LIB_NAME} into --isolation-lib-dir {lib_dir}: {err}"
    return ""


def install_preload(lib_dir: Path) -> str:
    """Write the preload list naming the library (atomically); the reason it failed, or ""."""
    try:
        _write_atomically(lib_dir / PRELOAD_NAME, f"{CONTAINER_LIB_DIR}/{LIB_NAME}\n", 0o644)
    except OSError as err:
        return f"cannot write {PRELOAD_NAME} into --isolation-lib-dir {lib_dir}: {err}"
    return ""


def _write_atomically(path: Path, text: str, mode: int) -> None:
    """Write through a temporary file and a rename: a reader sees the old file or the new."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp"
    tmp.write_text(text)
    tmp.chmod(mode)
    tmp.replace(path)


def devices_key(device_ids: tuple[str, ...]) -> str:
    """The directory name of a container known only by its device IDs."""
    return hashlib.sha256(",".join(sorted(device_ids)).encode()).hexdigest()[:16]


def accounting_key(target: Target) -> str:
    """The container's name in the state directory: ``<uid>/<container>`` or by device IDs."""
    who = {(c.uid, c.container) for c in target.candidates}
    if len(who) == 1:
        uid, container = next(iter(who))
        if uid and "/" not in uid and container and "/" not in container:
            return f"{uid}/{container}"
    return f"{BY_DEVICES}/{devices_key(target.device_ids)}"


def pod_of(key: str, target: Target | None = None) -> str:
    """What the broker's pod cap counts a container's connections under.

    The pod's UID when the key or the candidates name one pod; otherwise the key itself, until
    PodResources names the pod (``InterposerIsolation.weigh``).
    """
    uid, _, _ = key.partition("/")
    if uid != BY_DEVICES:
        return uid
    uids = {c.uid for c in target.candidates} if target is not None else set()
    return uids.pop() if len(uids) == 1 else key


def prune_accounting(
    root: Path,
    live_uids: frozenset[str],
    live_devices: frozenset[tuple[str, ...]],
    *,
    now: float,
    grace_s: float = PRUNE_GRACE_S,
) -> list[Path]:
    """Remove the per-container directories of gone containers older than the grace; list them."""
    keep_devices = {devices_key(d) for d in live_devices}
    candidates = [
        *(p for p in _children(root) if p.name != BY_DEVICES and p.name not in live_uids),
        *(p for p in _children(root / BY_DEVICES) if p.name not in keep_devices),
    ]
    removed = []
    for path in candidates:
        try:
            young = now - path.stat().st_mtime < grace_s
        except OSError:
            continue
        if not young:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _children(path: Path) -> list[Path]:
    try:
        return [p for p in path.iterdir() if p.is_dir()]
    except OSError:
        return []


class InterposerIsolation:
    """cgpu and core_mem: preload the interposer with the container's limits."""

    def __init__(
        self,
        *,
        lib_dir: Path,
        state_dir: Path,
        unit: MemoryUnit,
        packaged: Path | None = None,
        cgpu_policy: Policy = Policy.NATIVE,
        gpu_memory_mib: dict[int, int] | None = None,
        max_pods: int | None = None,
        caps: BrokerCaps | None = None,
        broker_stats: BrokerStats | None = None,
    ) -> None:
        self.lib_dir = lib_dir
        self.state_dir = state_dir
        self.unit = unit
        self.packaged = packaged
        self.broker = Broker(
            state_dir / "broker", on_active=self.note_active, caps=caps, stats=broker_stats
        )
        self.cgpu_policy = cgpu_policy
        self.gpu_memory_mib = gpu_memory_mib or {}
        self.max_pods = max_pods or unit.default_max_pods_per_gpu
        """The most pods one GPU may hold: policy 0's share is one over it."""
        self.members: dict[int, dict[str, Member]] = {}
        """Per host GPU index, the scheduled containers by account key."""
        self.policy_of: dict[int, Policy] = {}
        """Per host GPU index, the policy its schedule is laid out by (see :meth:`policy_for`)."""
        self.gpus_of: dict[str, tuple[int, ...]] = {}
        """Per account key, the host GPU of each device ordinal (as in its limits file)."""
        self.last_active: dict[tuple[str, int], float] = {}
        """(account key, host GPU) -> monotonic time of the container's last activity report."""
        self.clock = time.monotonic
        """Seconds, for activity; tests replace it."""
        self.epoch_ns = time.monotonic_ns()
        """CLOCK_MONOTONIC is the host's, containers included: one epoch for every schedule."""
        self.owners: dict[str, Owner] = {}
        """Per account key, whose it is (``deviceplugin.usage``): what the metrics label."""
        self.pods_by_uid: dict[str, str] = {}
        """``namespace/name`` of each pod Allocate saw a candidate of, for :meth:`weigh`."""

    def prepare(self, mode: Mode) -> str:
        """Install the library and the preload list, serve the accounts of running containers."""
        refused = install_library(self.packaged, self.lib_dir) or install_preload(self.lib_dir)
        if not refused:
            self.restore()
        return refused

    def restore(self) -> None:
        """Serve again every account whose limits file this plugin's version wrote."""
        root = self.state_dir / "limits"
        for path in sorted(root.glob(f"*/*/{LIMITS_FILE_NAME}")):
            key = path.parent.relative_to(root).as_posix()
            try:
                limits = ContainerLimits.parse(path.read_text())
                self.broker.open(key, limits.mem_limit_bytes, pod=pod_of(key), settle_s=SETTLE_S)
                owner = read_owner(path.parent)
                if owner is not None:
                    self.owners[key] = owner
                if limits.policy is not None:
                    member = Member(limits.slot, limits.core_pct, limits.weight)
                    self._join(key, limits.gpus, member, Policy(limits.policy))
            except (OSError, ValueError) as err:
                log.warning("key=%s phase=restore account not served: %s", key, err)
                continue
            log.info("key=%s phase=restore account served", key)
        self.write_schedules(set(self.members))

    def policy_for(self, target: Target, core_pct: int) -> Policy | None:
        """The policy whose schedule holds a container's launches, or None for no schedule.

        A cgpu node's containers keep to the node's cGPU policy (none under 5, native). A
        core_mem container with a share below the whole GPU gets policy 3, fixed: its share as one
        time slice of each period, used or not, which is what ``gpu-core.percentage`` promises
        (a ceiling that others' idleness does not lift). Time slices need no measurement; a
        rate throttle steered by NVML's utilisation samples, which lag by most of a second on a
        GPU, swung between 10 % and 100 % on an H100 where the slices held every share.
        """
        if target.mode is Mode.CGPU and self.cgpu_policy is not Policy.NATIVE:
            return self.cgpu_policy
        if target.mode is Mode.CORE_MEM and 0 < core_pct < CORE_PER_GPU:
            return Policy.FIXED
        return None

    def _join(self, key: str, gpus: tuple[int, ...], member: Member, policy: Policy) -> None:
        """Add a container to its GPUs' members, idle until it reports activity.

        Under policies 1, 2 and 4 an idle container owns no slice; its interposer reports
        before its first launch and waits for the broker's answer, which comes after the
        schedule names it, so it never launches outside its slices for want of one.
        """
        self.gpus_of[key] = gpus
        idle = replace(member, active=policy not in BY_ACTIVITY)
        for gpu in gpus:
            self.members.setdefault(gpu, {})[key] = idle
            self.policy_of[gpu] = policy

    def note_active(self, key: str, device: int) -> None:
        """The broker's report: a process of ``key`` launches on its device ordinal ``device``.

        The report marks the container active on that GPU; every report also marks idle the
        containers silent for :data:`IDLE_AFTER_S`, so no timer is needed: while nobody
        launches, nobody's share matters. Schedules are rewritten only when someone changes.
        """
        gpus = self.gpus_of.get(key, ())
        if not 0 <= device < len(gpus) or self.policy_of.get(gpus[device]) not in BY_ACTIVITY:
            return
        now = self.clock()
        self.last_active[(key, gpus[device])] = now
        changed = set()
        for gpu, members in self.members.items():
            for who, member in members.items():
                active = now - self.last_active.get((who, gpu), -IDLE_AFTER_S - 1) <= IDLE_AFTER_S
                if member.active != active:
                    members[who] = replace(member, active=active)
                    changed.add(gpu)
        if changed:
            self.write_schedules(changed)

    def write_schedules(self, gpus: set[int]) -> None:
        """Rewrite the schedule of each GPU from its members.

        Each container's interposer re-reads its GPU's file at most every 100 ms, and at once
        when the file does not name it.
        """
        for gpu in sorted(gpus):
            policy = self.policy_of.get(gpu)
            if policy is None:
                continue
            members = list(self.members.get(gpu, {}).values())
            plan = schedule(policy, members, max_pods=self.max_pods, epoch_ns=self.epoch_ns)
            _write_atomically(self.state_dir / SCHED / f"gpu{gpu}", plan.render(), 0o444)

    def fixed_share(self, signature: Signature) -> int:
        """Policy 3's share: the pod's computing power, else its memory's share of the GPU."""
        if signature.core_layout:
            return max(p for _, p in signature.core_layout)
        shares = [
            CORE_PER_GPU * units * self.unit.mib / self.gpu_memory_mib[gpu]
            for gpu, units in signature.layout
            if self.gpu_memory_mib.get(gpu)
        ]
        return max(1, min(CORE_PER_GPU, round(max(shares)))) if shares else CORE_PER_GPU

    def extend(self, answer: ContainerAnswer, target: Target) -> ContainerAnswer:
        """Add the preload, the limits and the broker's socket to a memory answer."""
        signature = target.signature
        if signature.resource != MEM:
            return answer
        key = accounting_key(target)
        limits = ContainerLimits(
            mem_limit_bytes=tuple(units * self.unit.mib * 2**20 for _, units in signature.layout),
            core_pct=(
                max(p for _, p in signature.core_layout)
                if target.mode is Mode.CORE_MEM and signature.core_layout
                else 0
            ),
            unit=self.unit.value,
            broker=CONTAINER_BROKER_SOCKET,
        )
        policy = self.policy_for(target, limits.core_pct)
        scheduled = policy is not None
        gpus = tuple(gpu for gpu, _ in signature.layout)
        if policy is not None:
            limits = replace(
                limits,
                core_pct=own_share_pct(
                    policy,
                    max_pods=self.max_pods,
                    weight=target.weight,
                    fixed_pct=self.fixed_share(signature),
                ),
                policy=int(policy),
                weight=target.weight,
                slot=slot_id(key),
                sched_dir=CONTAINER_SCHED_DIR,
                gpus=gpus,
            )
            self._join(key, gpus, Member(limits.slot, limits.core_pct, limits.weight), policy)
        limits_file = self.state_dir / "limits" / key / LIMITS_FILE_NAME
        try:
            if scheduled:
                self.write_schedules(set(gpus))
            _write_atomically(limits_file, limits.render(), 0o444)
            broker_dir = self.broker.open(key, limits.mem_limit_bytes, pod=pod_of(key, target))
            self._own(key, target, gpus, limits.core_pct)
        except OSError as err:
            raise IsolationError(
                f"cannot write the limits of this container or serve its account under "
                f"{self.state_dir}: {err}"
            ) from err
        envs = {
            **answer.envs,
            "LD_PRELOAD": f"{CONTAINER_LIB_DIR}/{LIB_NAME}",
            "GPUSHARE_MEM_LIMIT": mem_limit_text(limits.mem_limit_bytes),
        }
        if target.mode is Mode.CORE_MEM and limits.core_pct:
            envs["GPUSHARE_CORE_LIMIT"] = str(limits.core_pct)
        mounts = (
            *answer.mounts,
            (CONTAINER_LIB_DIR, str(self.lib_dir), True),
            (CONTAINER_PRELOAD_FILE, str(self.lib_dir / PRELOAD_NAME), True),
            (CONTAINER_LIMITS_FILE, str(limits_file), True),
            (CONTAINER_BROKER_DIR, str(broker_dir), True),
        )
        if scheduled:
            envs["GPUSHARE_CGPU_POLICY"] = str(limits.policy)
            mounts = (*mounts, (CONTAINER_SCHED_DIR, str(self.state_dir / SCHED), True))
        return replace(answer, envs=envs, mounts=mounts)

    def _own(self, key: str, target: Target, gpus: tuple[int, ...], core_pct: int) -> None:
        """Note whose the account is, in memory and beside its limits file."""
        for candidate in target.candidates:
            self.pods_by_uid[candidate.uid] = candidate.pod
        who = {(c.pod, c.container) for c in target.candidates}
        pod, container = next(iter(who)) if len(who) == 1 else ("", "")
        owner = Owner(pod=pod, container=container, gpus=gpus, core_pct=core_pct)
        self.owners[key] = owner
        write_owner(self.state_dir / "limits" / key, owner)

    def usage(self) -> list[ContainerUse]:
        """What every served container holds now, beside its limits, in key order."""
        out = []
        for key in sorted(self.owners):
            held = self.broker.usage(key)
            limits = self.broker.limits(key)
            if held is not None and limits is not None:
                out.append(ContainerUse(self.owners[key], held, limits))
        return out

    def prune(self, live_uids: frozenset[str], live_devices: frozenset[tuple[str, ...]]) -> None:
        """Close the accounts and remove the limits of containers that are gone."""
        for uid in [u for u in self.pods_by_uid if u not in live_uids]:
            del self.pods_by_uid[uid]
        for kind in PER_CONTAINER:
            root = self.state_dir / kind
            for path in prune_accounting(root, live_uids, live_devices, now=time.time()):
                log.info("%s=%s phase=prune", kind, path)
                gone = path.relative_to(root).as_posix()
                if kind == "broker":
                    for key in self.broker.served():
                        if key == gone or key.startswith(f"{gone}/"):
                            self.broker.drop(key)
                if kind == "limits":
                    self.forget(gone)

    def weigh(self, uid: str, container: str, device_ids: tuple[str, ...], weight: int) -> None:
        """Give a scheduled container its own pod's weight, once PodResources names the pod.

        Only the schedule changes: the limits file, mounted into the running container, keeps
        the weight Allocate gave (the interposer does not use it; the schedule's ``member=``
        lines say what counts). The broker counts the container's connections against the pod
        from now on, too.
        """
        by_devices = f"{BY_DEVICES}/{devices_key(device_ids)}"
        self.broker.attribute(by_devices, uid)
        owner = self.owners.get(by_devices)
        if owner is not None and not owner.pod and uid in self.pods_by_uid:
            named = Owner(self.pods_by_uid[uid], container, owner.gpus, owner.core_pct)
            self.owners[by_devices] = named
            with contextlib.suppress(OSError):
                write_owner(self.state_dir / "limits" / by_devices, named)
        key = next(
            (
                k
                for k in (f"{uid}/{container}", f"{BY_DEVICES}/{devices_key(device_ids)}")
                if k in self.gpus_of
            ),
            None,
        )
        if key is None:
            return
        changed = set()
        for gpu in self.gpus_of[key]:
            member = self.members.get(gpu, {}).get(key)
            if member is not None and member.weight != weight:
                self.members[gpu][key] = replace(member, weight=weight)
                changed.add(gpu)
        if changed:
            log.info("key=%s weight=%d phase=weigh from the pod's spec", key, weight)
            self.write_schedules(changed)

    def forget(self, gone: str) -> None:
        """Take the containers under an account key (or its pod) out of their GPUs' schedules."""
        changed = set()
        for gpu, members in self.members.items():
            for key in [k for k in members if k == gone or k.startswith(f"{gone}/")]:
                del members[key]
                self.last_active.pop((key, gpu), None)
                changed.add(gpu)
        for key in [k for k in self.gpus_of if k == gone or k.startswith(f"{gone}/")]:
            del self.gpus_of[key]
        for key in [k for k in self.owners if k == gone or k.startswith(f"{gone}/")]:
            del self.owners[key]
        self.write_schedules(changed)

    def close(self) -> None:
        """Stop serving the accounts; the library and the sockets stay for the next plugin."""
        self.broker.close()


class DaemonRunner(Protocol):
    """Starts, probes and stops one MPS control daemon, named by its pipe directory."""

    def missing(self) -> str:
        """Why no daemon can be run on this node, or ""."""
        ...

    def start(self, gpu: GpuInfo, pipe_dir: Path, log_dir: Path) -> None:
        """Start a daemon that serves only this GPU; raise OSError when it cannot."""
        ...

    def alive(self, pipe_dir: Path) -> bool:
        """Whether the daemon behind this pipe directory answers."""
        ...

    def stop(self, pipe_dir: Path) -> None:
        """Ask the daemon to quit."""
        ...


class MpsControl:
    """The real runner: ``nvidia-cuda-mps-control`` (needs the NVIDIA driver's MPS tools)."""

    binary = "nvidia-cuda-mps-control"

    def _env(self, pipe_dir: Path, **extra: str) -> dict[str, str]:
        return {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir), **extra}

    def missing(self) -> str:
        """Why MPS cannot run here, or ""."""
        if shutil.which(self.binary) is None:
            return (
                f"node mode is mps but {self.binary} is not on PATH in the device plugin's "
                f"container: mount the NVIDIA driver's MPS tools, or start with --isolation none"
            )
        return ""

    def start(self, gpu: GpuInfo, pipe_dir: Path, log_dir: Path) -> None:
        """``nvidia-cuda-mps-control -d`` with only this GPU visible."""
        env = self._env(
            pipe_dir, CUDA_MPS_LOG_DIRECTORY=str(log_dir), CUDA_VISIBLE_DEVICES=gpu.uuid
        )
        done = subprocess.run(
            [self.binary, "-d"], env=env, capture_output=True, text=True, timeout=30
        )
        if done.returncode != 0:
            raise OSError(f"{self.binary} -d exited {done.returncode}: {done.stderr.strip()}")

    def _ask(self, pipe_dir: Path, command: str) -> bool:
        try:
            done = subprocess.run(
                [self.binary],
                input=command + "\n",
                env=self._env(pipe_dir),
                capture_output=True,
                text=True,
                timeout=10,
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
        return done.returncode == 0

    def alive(self, pipe_dir: Path) -> bool:
        """``get_server_list`` answers."""
        return self._ask(pipe_dir, "get_server_list")

    def stop(self, pipe_dir: Path) -> None:
        """``quit``."""
        self._ask(pipe_dir, "quit")


class MpsIsolation:
    """mps: one control daemon per GPU, started lazily, restarted when dead, stopped at the end."""

    def __init__(
        self, *, runner: DaemonRunner, state_dir: Path, source: GpuSource, unit: MemoryUnit
    ) -> None:
        self.runner = runner
        self.state_dir = state_dir
        self.source = source
        self.unit = unit
        self.started: dict[str, Path] = {}

    def prepare(self, mode: Mode) -> str:
        """Refuse to start when MPS cannot run."""
        return self.runner.missing()

    def pipe_dir(self, gpu: GpuInfo) -> Path:
        """The GPU's pipe directory on the host."""
        return self.state_dir / "mps" / gpu.uuid / "pipe"

    def ensure(self, gpu: GpuInfo) -> Path:
        """Start the GPU's daemon unless it answers; return its pipe directory."""
        pipe = self.pipe_dir(gpu)
        if gpu.uuid in self.started and self.runner.alive(pipe):
            return pipe
        logs = pipe.parent / "log"
        try:
            pipe.mkdir(parents=True, exist_ok=True)
            logs.mkdir(parents=True, exist_ok=True)
            self.runner.start(gpu, pipe, logs)
        except OSError as err:
            raise IsolationError(
                f"cannot start the MPS control daemon for GPU {gpu.index}: {err}"
            ) from err
        verb = "restarted" if gpu.uuid in self.started else "started"
        self.started[gpu.uuid] = pipe
        log.info("gpu=%d uuid=%s pipe=%s phase=mps %s", gpu.index, gpu.uuid, pipe, verb)
        return pipe

    def extend(self, answer: ContainerAnswer, target: Target) -> ContainerAnswer:
        """Point the container at its GPU's daemon, with its pinned-memory limit."""
        signature = target.signature
        if signature.resource != MEM:
            return answer
        if len(signature.layout) != 1:
            raise IsolationError(
                f"mps nodes serve one GPU a container, this one got {len(signature.layout)}"
            )
        index, units = signature.layout[0]
        gpu = next((g for g in self.source.gpus() if g.index == index), None)
        if gpu is None:
            raise IsolationError(f"GPU {index} is not on this node any more")
        pipe = self.ensure(gpu)
        envs = {
            **answer.envs,
            "CUDA_MPS_PIPE_DIRECTORY": CONTAINER_MPS_PIPE_DIR,
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={units * self.unit.mib}M",
        }
        if signature.core_layout:
            envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(signature.core_layout[0][1])
        mounts = (*answer.mounts, (CONTAINER_MPS_PIPE_DIR, str(pipe), False))
        return replace(answer, envs=envs, mounts=mounts)

    def prune(self, live_uids: frozenset[str], live_devices: frozenset[tuple[str, ...]]) -> None:
        """Nothing per container: the daemons live as long as the plugin."""

    def weigh(self, uid: str, container: str, device_ids: tuple[str, ...], weight: int) -> None:
        """No schedules on mps nodes."""

    def close(self) -> None:
        """Stop every daemon this hook started."""
        for pipe in self.started.values():
            with contextlib.suppress(OSError):
                self.runner.stop(pipe)
        self.started.clear()


class NodeIsolation:
    """The plugin's hook: picks the one for the node's mode when the plugin starts.

    ``policy`` is ``auto`` (enforce what the mode promises, refusing to start when that is not
    possible) or ``none`` (serve every mode without isolation: the limits become advisory).
    """

    def __init__(
        self,
        *,
        policy: str,
        lib_dir: Path,
        state_dir: Path,
        unit: MemoryUnit,
        source: GpuSource,
        runner: DaemonRunner | None = None,
        packaged: Path | None = None,
        cgpu_policy: Policy = Policy.NATIVE,
        max_pods: int | None = None,
        caps: BrokerCaps | None = None,
        broker_stats: BrokerStats | None = None,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"--isolation={policy!r} is not supported: use auto or none")
        self.policy = policy
        self.cgpu_policy = cgpu_policy
        self.max_pods = max_pods
        self.lib_dir = lib_dir
        self.state_dir = state_dir
        self.unit = unit
        self.source = source
        self.runner = runner or MpsControl()
        self.packaged = packaged
        self.caps = caps
        """The accounting broker's connection caps (cgpu and core_mem nodes)."""
        self.broker_stats = broker_stats
        self.chosen: IsolationHook = NoIsolation()

    def prepare(self, mode: Mode) -> str:
        """Pick the hook for ``mode`` and prepare it."""
        if self.policy == "none" or not mode.isolated:
            if mode.isolated:
                log.warning(
                    "mode=%s isolation=none: limits are not enforced on this node", mode.value
                )
            self.chosen = NoIsolation()
        elif mode is Mode.MPS:
            self.chosen = MpsIsolation(
                runner=self.runner, state_dir=self.state_dir, source=self.source, unit=self.unit
            )
        else:
            self.chosen = InterposerIsolation(
                lib_dir=self.lib_dir,
                state_dir=self.state_dir,
                unit=self.unit,
                packaged=self.packaged,
                cgpu_policy=self.cgpu_policy,
                gpu_memory_mib={g.index: g.memory_mib for g in self.source.gpus()},
                max_pods=self.max_pods,
                caps=self.caps,
                broker_stats=self.broker_stats,
            )
            if mode is Mode.CGPU:
                log.info(
                    "mode=cgpu policy=%d %s max_pods_per_gpu=%d",
                    self.cgpu_policy,
                    self.cgpu_policy.name.lower(),
                    self.max_pods or self.unit.default_max_pods_per_gpu,
                )
        return self.chosen.prepare(mode)

    def extend(self, answer: ContainerAnswer, target: Target) -> ContainerAnswer:
        """Delegate to the chosen hook."""
        return self.chosen.extend(answer, target)

    def prune(self, live_uids: frozenset[str], live_devices: frozenset[tuple[str, ...]]) -> None:
        """Delegate to the chosen hook."""
        self.chosen.prune(live_uids, live_devices)

    def weigh(self, uid: str, container: str, device_ids: tuple[str, ...], weight: int) -> None:
        """Delegate to the chosen hook."""
        self.chosen.weigh(uid, container, device_ids, weight)

    @property
    def counts_usage(self) -> bool:
        """Whether the interposer's broker counts this node's containers' GPU memory."""
        return isinstance(self.chosen, InterposerIsolation)

    def usage(self) -> list[ContainerUse]:
        """Each container's GPU memory held and allowed; none where no interposer counts it
        (``share`` nodes, ``mps``, ``--isolation none``)."""
        return self.chosen.usage() if isinstance(self.chosen, InterposerIsolation) else []

    def close(self) -> None:
        """Delegate to the chosen hook."""
        self.chosen.close()
