"""``DraDriver``: the DRA kubelet plugin for one node, its parts wired and started in order.

Start: read the node and refuse a node not labelled ``gpushare.io/allocation-mode=dra`` (the
device plugin serves those; a node is in one mode), or one whose ``ack.node.gpu.schedule`` is no
shared mode; let the isolation hook prepare for the mode; check the hand-off can name every GPU
(under cdi-cri the node's CDI specs must); publish the slice; then serve kubelet's two sockets.
Afterwards the slice follows GPU health (``GpuSource.changed``), is published again when kubelet
registers the driver and checked every ``publishing.RECHECK_S`` (kubelet wipes slices), and the
isolation state of claims no longer prepared is pruned.

Prepare reads the claim, checks its UID, computes the hand-off (``preparing``), lets the
isolation hook add the interposer, its limits and the cGPU schedules, writes the claim's CDI
spec and then the checkpoint, and answers kubelet. A claim in the checkpoint whose spec is still
there is answered from the checkpoint (kubelet retries). Unprepare removes the spec, forgets the
claim and prunes what the hook kept for it. One lock orders them: the checkpoint and the hook's
schedules are written by one claim at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gpushare.core.model.inventory import Mode
from gpushare.core.model.kubejson import KubeObject, labels_of, name_of, uid_of
from gpushare.core.model.names import (
    ALLOCATION_MODE_DRA,
    LABEL_ALLOCATION_MODE,
)
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.handoff import Signature
from gpushare.dra.checkpoint import PreparedCheckpoint, PreparedClaim
from gpushare.dra.kubeletapi import Servers, Sockets
from gpushare.dra.preparing import (
    PreparedDevice,
    Refusal,
    check_claim,
    claim_spec,
    claim_users,
    hand_out,
    pending,
    prepared_devices,
    request_weight,
    results_of,
    spec_file_name,
)
from gpushare.dra.publishing import RECHECK_S, publish_slice
from gpushare.kube.port import KubeDict, KubeError, NotFound, SliceAPI
from gpushare.node.cdi import HandOff
from gpushare.node.enforcement.hook import ContainerAnswer, IsolationError, IsolationHook, Target
from gpushare.node.enforcement.library import write_atomically
from gpushare.node.gpus import GpuSource
from gpushare.node.preflight import StartRefused, node_mode

log = logging.getLogger(__name__)


class DriverAPI(SliceAPI, Protocol):
    """The API calls the driver makes: DRA's objects, its node, and (cgpu nodes) the pods a
    claim is reserved for, whose spec gives cGPU policy 2's weight."""

    async def get_node(self, name: str) -> KubeDict:
        """One node."""
        ...

    async def get_pod(self, namespace: str, name: str) -> KubeDict:
        """One pod."""
        ...


@dataclass(frozen=True)
class DriverConfig:
    """What the driver is told: its node, unit, directories and hand-off."""

    node: str
    unit: MemoryUnit
    state_dir: Path
    cdi_dir: Path
    """Where claims' CDI specs are written: one of the runtime's ``cdi_spec_dirs``."""
    sockets: Sockets
    handoff: HandOff
    max_pods: int = 20
    """The most pods a GPU may hold (the chart's maxPodsPerGpu): cGPU weights' ceiling."""


def refuse_not_dra(node: KubeObject, name: str) -> str | None:
    """Why the DRA driver must not serve this node (not labelled for DRA); None when it may."""
    value = labels_of(node).get(LABEL_ALLOCATION_MODE)
    if value == ALLOCATION_MODE_DRA:
        return None
    now = f"has {LABEL_ALLOCATION_MODE}={value!r}" if value is not None else "has no label"
    return (
        f"node {name} {now}; the DRA driver serves only nodes labelled "
        f"{LABEL_ALLOCATION_MODE}={ALLOCATION_MODE_DRA} (the device plugin serves the others, "
        f"and a node is in one mode): label it (kubectl label node {name} --overwrite "
        f"{LABEL_ALLOCATION_MODE}={ALLOCATION_MODE_DRA}) after draining its GPU pods, or keep "
        f"the driver off it (the chart schedules it on labelled nodes only)"
    )


class DraDriver:
    """The DRA kubelet plugin of one node."""

    def __init__(
        self,
        *,
        api: DriverAPI,
        source: GpuSource,
        config: DriverConfig,
        hook: IsolationHook,
    ) -> None:
        self.api = api
        self.source = source
        self.config = config
        self.hook = hook
        self.mode = Mode.SHARE
        self.checkpoint = PreparedCheckpoint(config.state_dir / f"dra-prepared-{config.node}.json")
        self.servers = Servers(self, config.sockets)
        self._lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._registered = False
        self._registration_error = ""
        self._slice_error = ""
        self._node: KubeObject = {}
        self._republish: asyncio.Task[None] | None = None

    # -- start and stop ------------------------------------------------------------------------

    async def start(self) -> None:
        """Check the node, publish its slice, serve kubelet; StartRefused says why not."""
        node = await self.api.get_node(self.config.node)
        self._node = node
        reason = refuse_not_dra(node, self.config.node)
        if reason is not None:
            raise StartRefused(reason)
        checked = node_mode(node)
        if checked.refused is not None:
            raise StartRefused(checked.refused)
        self.mode = checked.mode
        reason = self.hook.prepare(self.mode)
        gpus = self.source.gpus()
        reason = reason or self.config.handoff.refusal(
            [g.uuid for g in gpus], [g.minor for g in gpus]
        )
        if reason is not None:
            raise StartRefused(reason)
        self.config.cdi_dir.mkdir(parents=True, exist_ok=True)
        await self.publish()
        await self.servers.start()
        self._tasks = [
            asyncio.create_task(self._follow_health()),
            asyncio.create_task(self._recheck()),
        ]
        log.info(
            "node=%s mode=%s unit=%s gpus=%d prepared=%d phase=start",
            self.config.node,
            self.mode.value,
            self.config.unit.value,
            len(gpus),
            len(self.checkpoint.uids()),
        )

    async def stop(self) -> None:
        """Stop the loops and the servers (kubelet deregisters the driver)."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.servers.stop(grace=0.5)
        self.hook.close()

    def not_ready(self) -> str:
        """Why the driver is not ready ("" when it is): kubelet has not registered it, or the
        slice could not be published."""
        if self._slice_error:
            return f"cannot publish the node's ResourceSlice: {self._slice_error}"
        if not self._registered:
            why = f": {self._registration_error}" if self._registration_error else ""
            return f"kubelet has not registered the driver yet{why}"
        return ""

    def registered(self, ok: bool, error: str) -> None:
        """kubelet's word on the registration (``NotifyRegistrationStatus``)."""
        self._registered, self._registration_error = ok, error
        if ok:
            log.info("node=%s phase=registered", self.config.node)
            # kubelet deletes the node's slices when it starts, before it registers drivers:
            # publish again now rather than at the next recheck
            self._republish = asyncio.get_running_loop().create_task(self._publish_quietly())
        else:
            log.warning(
                "node=%s phase=registration refused by kubelet: %s", self.config.node, error
            )

    # -- the slice ------------------------------------------------------------------------------

    async def publish(self) -> None:
        """Make the node's slice say what the GPUs are now."""
        try:
            await publish_slice(
                self.api,
                node=self.config.node,
                unit=self.config.unit,
                mode=self.mode,
                gpus=self.source.gpus(),
                owner=self._node,
            )
            self._slice_error = ""
        except KubeError as err:
            self._slice_error = str(err)
            raise

    async def _publish_quietly(self) -> None:
        try:
            await self.publish()
        except KubeError as err:
            log.warning("node=%s phase=publish cannot publish the slice: %s", self.config.node, err)

    async def _follow_health(self) -> None:
        while True:
            await self.source.changed()
            bad = [g.index for g in self.source.gpus() if not g.healthy]
            log.info("node=%s unhealthy=%s phase=health republish", self.config.node, bad)
            with contextlib.suppress(KubeError):
                await self.publish()

    async def _recheck(self) -> None:
        while True:
            await asyncio.sleep(RECHECK_S)
            try:
                await self.publish()
            except KubeError as err:
                log.warning(
                    "node=%s phase=recheck cannot publish the slice: %s", self.config.node, err
                )
            async with self._lock:
                self.hook.prune(self.checkpoint.uids(), frozenset())

    # -- prepare and unprepare --------------------------------------------------------------------

    def _spec_path(self, uid: str) -> Path:
        return self.config.cdi_dir / spec_file_name(uid)

    async def prepare(
        self, namespace: str, name: str, uid: str
    ) -> tuple[PreparedDevice, ...] | str:
        """The claim's devices with their CDI names, or why not (kubelet shows it, and retries)."""
        async with self._lock:
            known = self.checkpoint.get(uid)
            if known is not None and Path(known.spec_file).exists():
                return known.devices
            try:
                claim = await self.api.get_resource_claim(namespace, name)
            except NotFound:
                return f"ResourceClaim {namespace}/{name} not found; kubelet retries"
            except KubeError as err:
                return f"cannot read ResourceClaim {namespace}/{name}: {err}"
            refused = check_claim(claim, namespace=namespace, name=name, uid=uid)
            users = await self._users(claim) if self.mode is Mode.CGPU else []
            outcome = refused or self._prepare(claim, uid, users)
            if isinstance(outcome, Refusal):
                log.warning(
                    "claim=%s/%s uid=%s phase=prepare refused: %s",
                    namespace,
                    name,
                    uid,
                    outcome.reason,
                )
                return outcome.reason
            return outcome

    async def _users(self, claim: KubeObject) -> list[KubeObject]:
        """The pods the claim is reserved for, as far as they can be read."""
        meta = claim.get("metadata") or {}
        pods: list[KubeObject] = []
        for name in claim_users(claim):
            try:
                pods.append(await self.api.get_pod(str(meta.get("namespace", "")), name))
            except KubeError as err:
                log.warning(
                    "claim=%s pod=%s phase=prepare cannot read the pod: %s",
                    uid_of(claim),
                    name,
                    err,
                )
        return pods

    def _weight(self, claim: KubeObject, request: str, users: Sequence[KubeObject]) -> int:
        readings = [
            request_weight(p, name_of(claim), request, max_weight=self.config.max_pods)
            for p in users
        ]
        for reading in readings:
            if reading.problem:
                log.warning(
                    "claim=%s phase=prepare cgpu weight: %s", uid_of(claim), reading.problem
                )
        return min((r.weight for r in readings), default=1)

    def _prepare(
        self, claim: KubeObject, uid: str, users: Sequence[KubeObject] = ()
    ) -> tuple[PreparedDevice, ...] | Refusal:
        gpus = self.source.gpus()
        results = results_of(claim, pool=self.config.node, unit=self.config.unit, gpus=gpus)
        if isinstance(results, Refusal):
            return results
        if not results:  # nothing of this driver on this node: no spec (CDI wants a device)
            return ()
        handouts = hand_out(
            results, gpus=gpus, unit=self.config.unit, mode=self.mode, handoff=self.config.handoff
        )
        answers: dict[str, ContainerAnswer] = {}
        for handout in handouts:
            target = Target(
                handout.signature,
                self.mode,
                candidates=(pending(claim, handout),),
                device_ids=(f"{uid}/{handout.request}",),
                weight=self._weight(claim, handout.request, users),
            )
            try:
                answers[handout.request] = self.hook.extend(handout.answer, target)
            except IsolationError as err:
                return Refusal(f"gpushare.io: {err}")
        path = self._spec_path(uid)
        devices = prepared_devices(uid, handouts, answers, pool=self.config.node, gpus=gpus)
        meta = claim.get("metadata") or {}
        try:
            write_atomically(path, json.dumps(claim_spec(uid, answers), indent=1), 0o644)
            self.checkpoint.remember(
                PreparedClaim(
                    uid=uid,
                    namespace=str(meta.get("namespace", "")),
                    name=str(meta.get("name", "")),
                    devices=devices,
                    spec_file=str(path),
                )
            )
        except OSError as err:
            return Refusal(
                f"gpushare.io: cannot write the claim's CDI spec {path} or the checkpoint under "
                f"{self.config.state_dir}: {err}"
            )
        log.info(
            "claim=%s/%s uid=%s devices=%s phase=prepare %s",
            meta.get("namespace"),
            meta.get("name"),
            uid,
            ",".join(d.device for d in devices),
            " ".join(_layout(h.request, h.signature) for h in handouts),
        )
        return devices

    async def unprepare(self, namespace: str, name: str, uid: str) -> str | None:
        """Remove the claim's spec and what was kept for it; None when done."""
        async with self._lock:
            known = self.checkpoint.get(uid)
            path = Path(known.spec_file) if known is not None else self._spec_path(uid)
            try:
                path.unlink(missing_ok=True)
                self.checkpoint.forget(uid)
            except OSError as err:
                return f"gpushare.io: cannot remove the claim's CDI spec {path}: {err}"
            self.hook.prune(self.checkpoint.uids(), frozenset())
            log.info("claim=%s/%s uid=%s phase=unprepare", namespace, name, uid)
            return None


def _layout(request: str, signature: Signature) -> str:
    mem = ",".join(f"{i}:{m}" for i, m in signature.layout)
    cores = ",".join(f"{i}:{p}" for i, p in signature.core_layout)
    return f"request={request} mem={mem}" + (f" cores={cores}" if cores else "")
