"""The device plugin process: kubelet's v1beta1 API over unix sockets, for each resource.

Life cycle:

1. read the node (its ``ack.node.gpu.schedule`` mode), publish the per-GPU inventory, the unit
   and the hand-off marker as node annotations, and ``aliyun.com/gpu-count`` in node status;
2. serve ``aliyun.com/gpu-mem`` (and ``aliyun.com/gpu-core.percentage`` on core_mem nodes) on
   their own sockets and register each with kubelet;
3. re-serve and re-register whenever ``kubelet.sock`` is re-created (kubelet restarted and
   wiped the socket directory);
4. on a health change, send the new device list on every ListAndWatch stream and republish the
   inventory, so the scheduler stops placing pods on the GPU;
5. every second, read kubelet's PodResources API: each pod whose listed containers (regular and
   restartable init containers; kubelet never lists ordinary ones) all got devices is
   checked against what Allocate served for those device IDs and marked served
   (``ALIYUN_COM_GPU_MEM_ASSIGNED=true``); a difference is counted and logged as a mismatch.

``Allocate`` never guesses: it lists the pods bound to this node, keeps those not yet served,
and answers from the one signature their containers of that size share (core.handoff). What it
served per device-ID set is written to a small checkpoint, so a restart of the plugin loses
nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
import yaml

from gpushare.core.allocation import Allocation, from_pod
from gpushare.core.handoff import (
    CORE,
    MEM,
    Signature,
    listed_signatures,
    pending_of,
    resolve,
)
from gpushare.core.inventory import Gpu, inventory_annotation
from gpushare.core.kubejson import labels_of
from gpushare.core.ledger import is_terminal
from gpushare.core.names import (
    ANN_ASSIGNED,
    ANN_NODE_GPUS,
    ANN_NODE_HANDOFF,
    ANN_NODE_UNIT,
    DEFAULT_NAMES,
    HANDOFF_PODRESOURCES,
    LABEL_MODE,
    ResourceNames,
)
from gpushare.core.unitchange import refuse_unit_change
from gpushare.core.units import MemoryUnit
from gpushare.deviceplugin.gpus import GpuSource
from gpushare.deviceplugin.protos.podresources_v1 import api_pb2 as pr
from gpushare.deviceplugin.protos.podresources_v1 import api_pb2_grpc as pr_grpc
from gpushare.deviceplugin.protos.v1beta1 import api_pb2 as dp
from gpushare.deviceplugin.protos.v1beta1 import api_pb2_grpc as dp_grpc
from gpushare.deviceplugin.serving import (
    HEALTHY,
    UNHEALTHY,
    IsolationError,
    IsolationHook,
    NoIsolation,
    Target,
    container_answer,
    devices,
    mem_units,
)
from gpushare.kube.port import KubeAPI, KubeError

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"


@dataclass
class Stats:
    """Counters the tests and the metrics read."""

    allocations: int = 0
    refused: int = 0
    served_pods: int = 0
    mismatches: int = 0
    registrations: int = 0


@dataclass
class PluginConfig:
    """Where things are and what to serve."""

    node: str
    plugin_dir: Path = Path("/var/lib/kubelet/device-plugins")
    pod_resources_socket: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    state_dir: Path = Path("/var/lib/gpushare")
    unit: MemoryUnit = MemoryUnit.GiB
    names: ResourceNames = field(default_factory=lambda: DEFAULT_NAMES)
    check_interval: float = 1.0

    @property
    def kubelet_socket(self) -> Path:
        return self.plugin_dir / "kubelet.sock"


class StartRefused(Exception):
    """The plugin must not start; the message says why and what to do."""


class _Servicer(dp_grpc.DevicePluginServicer):
    """One resource's DevicePlugin service."""

    def __init__(self, plugin: DevicePlugin, resource: str) -> None:
        self.plugin = plugin
        self.resource = resource

    async def GetDevicePluginOptions(
        self, request: dp.Empty, context: Any
    ) -> dp.DevicePluginOptions:
        return dp.DevicePluginOptions(get_preferred_allocation_available=True)

    async def ListAndWatch(
        self, request: dp.Empty, context: Any
    ) -> AsyncIterator[dp.ListAndWatchResponse]:
        generation = -1
        while True:
            generation = await self.plugin.wait_generation(generation)
            entries = devices(self.resource, self.plugin.source.gpus(), self.plugin.config.unit)
            yield dp.ListAndWatchResponse(
                devices=[
                    dp.Device(ID=e.id, health=HEALTHY if e.healthy else UNHEALTHY) for e in entries
                ]
            )

    async def GetPreferredAllocation(
        self, request: dp.PreferredAllocationRequest, context: Any
    ) -> dp.PreferredAllocationResponse:
        responses = []
        for ask in request.container_requests:
            chosen = list(ask.must_include_deviceIDs)
            for device in sorted(ask.available_deviceIDs):
                if len(chosen) >= ask.allocation_size:
                    break
                if device not in chosen:
                    chosen.append(device)
            responses.append(dp.ContainerPreferredAllocationResponse(deviceIDs=chosen))
        return dp.PreferredAllocationResponse(container_responses=responses)

    async def Allocate(self, request: dp.AllocateRequest, context: Any) -> dp.AllocateResponse:
        responses = []
        for ask in request.container_requests:
            answer, error = await self.plugin.allocate(self.resource, list(ask.devices_ids))
            if answer is None:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, error)
            responses.append(answer)
        return dp.AllocateResponse(container_responses=responses)

    async def PreStartContainer(
        self, request: dp.PreStartContainerRequest, context: Any
    ) -> dp.PreStartContainerResponse:
        return dp.PreStartContainerResponse()


class DevicePlugin:
    """Serves kubelet for one node."""

    def __init__(
        self,
        *,
        api: KubeAPI,
        source: GpuSource,
        config: PluginConfig,
        hook: IsolationHook | None = None,
    ) -> None:
        self.api = api
        self.source = source
        self.config = config
        self.hook = hook or NoIsolation()
        self.stats = Stats()
        self.mode = "share"
        self.resources: list[str] = [MEM]
        self._servers: dict[str, grpc.aio.Server] = {}
        self._generation = 0
        self._gen_cond: asyncio.Condition | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._served: dict[str, dict[str, Any]] = self._load_checkpoint()
        self._marked: set[str] = set()
        """UIDs of pods marked served. PodResources names pods by namespace and name only, and a
        StatefulSet re-creates a pod under the same name; the UID comes from the pod bound now."""
        self.mismatch_log: list[str] = []

    # -- names -----------------------------------------------------------------------------

    def resource_name(self, resource: str) -> str:
        return self.config.names.mem if resource == MEM else self.config.names.core

    def endpoint(self, resource: str) -> str:
        return f"gpushare-{resource}.sock"

    # -- health generations -------------------------------------------------------------------

    async def wait_generation(self, seen: int) -> int:
        """Return the current generation once it differs from ``seen``."""
        if self._gen_cond is None:
            self._gen_cond = asyncio.Condition()
        async with self._gen_cond:
            await self._gen_cond.wait_for(lambda: self._generation != seen)
            return self._generation

    async def _bump(self) -> None:
        if self._gen_cond is None:
            self._gen_cond = asyncio.Condition()
        async with self._gen_cond:
            self._generation += 1
            self._gen_cond.notify_all()

    # -- start and stop ------------------------------------------------------------------------

    async def start(self) -> None:
        """Publish the node, serve and register every resource, start the watchers.

        Raises StartRefused, before anything is published, when the configured unit differs
        from the node's published one while pods still hold GPU memory counted in it, or when
        the isolation hook cannot serve the node's mode.
        """
        node = await self.api.get_node(self.config.node)
        pods, _ = await self.api.list_pods(self.config.node)
        reason = refuse_unit_change(node, pods, self.config.unit, names=self.config.names)
        if reason:
            raise StartRefused(reason)
        self.mode = labels_of(node).get(LABEL_MODE, "share")
        self.resources = [MEM, CORE] if self.mode == "core_mem" else [MEM]
        reason = self.hook.prepare(self.mode)
        if reason:
            raise StartRefused(reason)
        await self.publish()
        await self._bump()
        await self.serve_and_register()
        self._tasks = [
            asyncio.create_task(self._watch_kubelet()),
            asyncio.create_task(self._watch_health()),
            asyncio.create_task(self._check_served_loop()),
        ]
        log.info(
            "node=%s mode=%s resources=%s gpus=%d phase=start",
            self.config.node,
            self.mode,
            ",".join(self.resources),
            len(self.source.gpus()),
        )

    async def stop(self) -> None:
        """Stop the watchers and the servers."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for server in self._servers.values():
            await server.stop(grace=0.5)
        self._servers.clear()
        self.hook.close()

    async def publish(self) -> None:
        """Write the inventory, unit and hand-off marker on the node, and gpu-count in status."""
        gpus = tuple(
            Gpu(
                index=g.index,
                mem_units=mem_units(g, self.config.unit),
                healthy=g.healthy,
                uuid=g.uuid,
                model=g.model,
            )
            for g in self.source.gpus()
        )
        await self.api.patch_node(
            self.config.node,
            annotations={
                ANN_NODE_GPUS: inventory_annotation(gpus),
                ANN_NODE_UNIT: self.config.unit.value,
                ANN_NODE_HANDOFF: HANDOFF_PODRESOURCES,
            },
            capacity={self.config.names.count: str(len(gpus))},
        )

    async def serve_and_register(self) -> None:
        """(Re)create each resource's socket and register it with kubelet."""
        for server in self._servers.values():
            await server.stop(grace=0.2)
        self._servers.clear()
        self.config.plugin_dir.mkdir(parents=True, exist_ok=True)
        for resource in self.resources:
            path = self.config.plugin_dir / self.endpoint(resource)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            server = grpc.aio.server()
            dp_grpc.add_DevicePluginServicer_to_server(_Servicer(self, resource), server)
            server.add_insecure_port(f"unix://{path}")
            await server.start()
            self._servers[resource] = server
        for resource in self.resources:
            await self._register(resource)

    async def _register(self, resource: str) -> None:
        async with grpc.aio.insecure_channel(f"unix://{self.config.kubelet_socket}") as channel:
            await dp_grpc.RegistrationStub(channel).Register(
                dp.RegisterRequest(
                    version=API_VERSION,
                    endpoint=self.endpoint(resource),
                    resource_name=self.resource_name(resource),
                    options=dp.DevicePluginOptions(get_preferred_allocation_available=True),
                ),
                timeout=10,
            )
        self.stats.registrations += 1
        log.info(
            "resource=%s endpoint=%s phase=register",
            self.resource_name(resource),
            self.endpoint(resource),
        )

    async def _watch_kubelet(self) -> None:
        """Re-register when kubelet.sock is re-created."""

        def inode() -> tuple[int, int]:
            # the inode number alone can be reused at once; its change time cannot
            try:
                stat = os.stat(self.config.kubelet_socket)
            except FileNotFoundError:
                return (0, 0)
            return (stat.st_ino, stat.st_ctime_ns)

        current = inode()
        while True:
            await asyncio.sleep(0.2)
            now = inode()
            if now[0] and now != current:
                log.info("kubelet.sock re-created; serving and registering again")
                try:
                    await self.serve_and_register()
                    current = now
                except grpc.aio.AioRpcError as err:
                    log.warning("re-registration failed, will retry: %s", err.details())
            elif not now[0]:
                current = (0, 0)

    async def _watch_health(self) -> None:
        while True:
            await self.source.changed()
            await self._bump()
            try:
                await self.publish()
            except KubeError as err:
                log.warning("cannot republish the inventory after a health change: %s", err)

    # -- Allocate ----------------------------------------------------------------------------

    async def bound_allocations(self) -> list[Allocation]:
        """Allocations of the live pods bound to this node, from the API."""
        pods, _ = await self.api.list_pods(self.config.node)
        allocations = (from_pod(pod) for pod in pods if not is_terminal(pod))
        return [a for a in allocations if a is not None and a.node == self.config.node]

    async def allocate(self, resource: str, device_ids: list[str]) -> tuple[Any, str]:
        """Answer one container; (response, "") or (None, reason)."""
        count = len(device_ids)
        try:
            pending = pending_of(await self.bound_allocations())
        except KubeError as err:
            self.stats.refused += 1
            return None, f"gpushare: cannot read the pods bound to {self.config.node}: {err}"
        answer = resolve(resource, count, pending)
        if answer.signature is None:
            self.stats.refused += 1
            log.warning(
                "resource=%s count=%d phase=allocate refused: %s", resource, count, answer.error
            )
            return None, f"gpushare: {answer.error}"
        target = Target(answer.signature, self.mode, answer.candidates, tuple(device_ids))
        try:
            result = self.hook.extend(
                container_answer(answer.signature, self.source.gpus(), self.config.unit, self.mode),
                target,
            )
        except IsolationError as err:
            self.stats.refused += 1
            log.error("resource=%s count=%d phase=allocate isolation: %s", resource, count, err)
            return None, f"gpushare: {err}"
        self._remember(device_ids, answer.signature)
        self.stats.allocations += 1
        response = dp.ContainerAllocateResponse(
            envs=dict(result.envs),
            annotations=dict(result.annotations),
            mounts=[
                dp.Mount(container_path=c, host_path=h, read_only=r) for c, h, r in result.mounts
            ],
        )
        return response, ""

    # -- what was served, checked afterwards --------------------------------------------------

    @property
    def _checkpoint(self) -> Path:
        return self.config.state_dir / f"served-{self.config.node}.json"

    def _load_checkpoint(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self._checkpoint.read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def _remember(self, device_ids: list[str], signature: Signature) -> None:
        self._served[",".join(sorted(device_ids))] = asdict(signature)
        try:
            self.config.state_dir.mkdir(parents=True, exist_ok=True)
            tmp = self._checkpoint.with_suffix(".tmp")
            tmp.write_text(json.dumps(self._served))
            tmp.replace(self._checkpoint)
        except OSError as err:
            log.warning("cannot write the checkpoint %s: %s", self._checkpoint, err)

    def served_signature(self, device_ids: list[str]) -> Signature | None:
        """What Allocate answered for exactly these device IDs, if it did."""
        raw = self._served.get(",".join(sorted(device_ids)))
        if raw is None:
            return None
        return Signature(
            resource=raw["resource"],
            count=raw["count"],
            layout=tuple(tuple(x) for x in raw["layout"]),  # type: ignore[misc]
            pod_mem_units=raw["pod_mem_units"],
            core_layout=tuple(tuple(x) for x in raw["core_layout"]),  # type: ignore[misc]
        )

    async def check_served(self) -> None:
        """Read PodResources; mark pods served, count mismatches, let the hook prune."""
        async with grpc.aio.insecure_channel(f"unix://{self.config.pod_resources_socket}") as ch:
            listing = await pr_grpc.PodResourcesListerStub(ch).List(
                pr.ListPodResourcesRequest(), timeout=10
            )
        by_key = {(a.namespace, a.name): a for a in await self.bound_allocations()}
        self._marked &= {a.uid for a in by_key.values()}  # forget pods that are gone
        ours = {self.resource_name(r): r for r in self.resources}
        # kubelet reports each device ID in an entry of its own (one per NUMA node), so a
        # container's set is the union of its entries (kubernetes/kubernetes
        # pkg/kubelet/cm/container_manager.go, containerDevicesFromResourceDeviceInstances)
        sets: dict[tuple[str, str], dict[tuple[str, str], set[str]]] = {}
        for pod in listing.pod_resources:
            per_pod = sets.setdefault((pod.namespace, pod.name), {})
            for container in pod.containers:
                for dev in container.devices:
                    if dev.resource_name in ours:
                        key = (container.name, ours[dev.resource_name])
                        per_pod.setdefault(key, set()).update(dev.device_ids)
        self.hook.prune(
            frozenset(a.uid for a in by_key.values()),
            frozenset(
                tuple(sorted(ids))
                for per_pod in sets.values()
                for (_, resource), ids in per_pod.items()
                if resource == MEM
            ),
        )
        for pod in listing.pod_resources:
            allocation = by_key.get((pod.namespace, pod.name))
            if allocation is None or allocation.assigned:
                continue
            got = {key: sorted(ids) for key, ids in sets[(pod.namespace, pod.name)].items()}
            expected = listed_signatures(allocation)
            if set(expected) - set(got):
                continue  # not every container admitted yet
            ok = True
            for key, signature in expected.items():
                served = self.served_signature(got[key])
                if served is not None and served != signature:
                    ok = False
                    self.stats.mismatches += 1
                    message = (
                        f"pod {allocation.key} container {key[0]} was served {served.layout} "
                        f"but placed on {signature.layout}"
                    )
                    self.mismatch_log.append(message)
                    log.error("phase=check mismatch: %s", message)
            if ok and allocation.uid not in self._marked:
                try:
                    await self.api.patch_pod_annotations(
                        pod.namespace, pod.name, {ANN_ASSIGNED: "true"}, resource_version=""
                    )
                    self._marked.add(allocation.uid)
                    self.stats.served_pods += 1
                except KubeError as err:
                    log.warning("pod=%s cannot mark served: %s", allocation.key, err)

    async def _check_served_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.check_interval)
            try:
                await self.check_served()
            except (grpc.aio.AioRpcError, KubeError, OSError) as err:
                log.debug("PodResources check skipped: %s", err)


def refuse_static_cpu_policy(kubelet_config: Path, cpu_manager_state: Path) -> str:
    """Why the plugin must not start (kubelet runs the static CPU policy), or ''."""
    for path, key in ((kubelet_config, "cpuManagerPolicy"), (cpu_manager_state, "policyName")):
        try:
            text = path.read_text()
        except OSError:
            continue
        try:
            data = yaml.safe_load(text)  # JSON (cpu_manager_state) is YAML too
        except yaml.YAMLError:
            continue
        if isinstance(data, dict) and str(data.get(key, "")).lower() == "static":
            return (
                f"kubelet runs {key}: static ({path}); shared GPU scheduling does not support "
                f"the static CPU manager policy: set cpuManagerPolicy: none on this node"
            )
    return ""
