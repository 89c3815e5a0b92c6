"""cgpu and core_mem: the native interposer preloaded with the container's limits, accounted by
the plugin's broker, scheduled by the node's cGPU policy.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import replace
from pathlib import Path

from gpushare.core.admitting.isolationpaths import (
    CONTAINER_BROKER_DIR,
    CONTAINER_LIB_DIR,
    CONTAINER_LIMITS_FILE,
    CONTAINER_PRELOAD_FILE,
    CONTAINER_SCHED_DIR,
)
from gpushare.core.model.inventory import CORE_PER_GPU, Mode
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.handoff import MEM, Signature
from gpushare.isolation.build import LIB_NAME
from gpushare.isolation.limits import (
    LIMITS_FILE_NAME,
    UUID_FORM,
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
from gpushare.node.descriptors import BrokerCaps
from gpushare.node.enforcement.accounts import (
    BY_DEVICES,
    PER_CONTAINER,
    accounting_key,
    devices_key,
    pod_of,
    prune_accounting,
)
from gpushare.node.enforcement.broker import CONTAINER_BROKER_SOCKET, SETTLE_S, Broker, BrokerStats
from gpushare.node.enforcement.hook import (
    ContainerAnswer,
    IsolationError,
    Target,
)
from gpushare.node.enforcement.library import (
    PRELOAD_NAME,
    install_library,
    install_preload,
    write_atomically,
)
from gpushare.node.usage import ContainerUse, Owner, read_owner, write_owner

log = logging.getLogger(__name__)

SCHED = "sched"
"""The state directory's per-GPU schedule files (cGPU policies 0..4), ``gpu<index>``."""
BY_ACTIVITY = (Policy.PREEMPTIVE, Policy.WEIGHTED, Policy.SOFT)
"""Policies whose shares go to the containers active on the GPU now."""


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
        gpu_uuids: dict[int, str] | None = None,
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
        self.gpu_uuids = gpu_uuids or {}
        """Per host GPU index, its NVML UUID: the limits file names each GPU by it."""
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
        """Per account key, whose it is (``node.usage``): what the metrics label."""
        self.pods_by_uid: dict[str, str] = {}
        """``namespace/name`` of each pod Allocate saw a candidate of, for :meth:`weigh`."""

    def prepare(self, mode: Mode) -> str | None:
        """Install the library and the preload list, serve the accounts of running containers."""
        refused = install_library(self.packaged, self.lib_dir) or install_preload(self.lib_dir)
        if refused is None:
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
            write_atomically(self.state_dir / SCHED / f"gpu{gpu}", plan.render(), 0o444)

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

    def uuids_of(self, gpus: tuple[int, ...]) -> tuple[str, ...]:
        """The UUIDs that key each GPU's limit in the limits file, or () to key them by ordinal.

        By UUID, a container that reorders its GPUs (``CUDA_VISIBLE_DEVICES=1,0``, or UUIDs in
        another order) keeps each GPU's own limit. Only GPUs whose every UUID is in NVML's form
        can be compared with the driver's (``cuDeviceGetUuid``): a fake node's are not, and its
        files name none, as before. A real GPU without a UUID here is an error, never a file
        keyed by ordinal.
        """
        uuids = tuple(self.gpu_uuids.get(gpu, "") for gpu in gpus)
        if all(UUID_FORM.fullmatch(u) for u in uuids):
            return uuids
        if any(UUID_FORM.fullmatch(u) for u in self.gpu_uuids.values()):
            raise IsolationError(
                f"GPUs {list(gpus)} have UUIDs {list(uuids)}, not all of them this node's NVML "
                f"UUIDs: the limits file must name each GPU by its UUID; restart the device "
                f"plugin so it reads the node's GPUs again"
            )
        return ()

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
            uuids=self.uuids_of(tuple(gpu for gpu, _ in signature.layout)),
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
            write_atomically(limits_file, limits.render(), 0o444)
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
