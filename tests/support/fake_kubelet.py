"""A fake kubelet: the device-plugin side of kubelet, on temporary unix sockets.

It serves ``Registration`` on ``kubelet.sock`` and the ``PodResourcesLister`` API, follows each
registered plugin's ``ListAndWatch``, and admits pods as kubelet does: one ``Allocate`` call per
container and resource, with device IDs it picks itself from the healthy, unused ones (asking
``GetPreferredAllocation`` first). It never tells the plugin which pod it is admitting.

What it copies from kubelet's device manager (kubernetes/kubernetes
pkg/kubelet/cm/devicemanager/manager.go, ``allocateContainerResources``): the number of device
IDs in a container's ``Allocate`` is exactly the container's limit of that resource
(``needed := int(v.Value())``), whatever the plugin advertises per device, so
``gpu-core.percentage: 30`` asks for 30 devices.

Init containers, as there and in pod_devices.go: kubelet calls ``Allocate`` for every container,
init containers first. The devices of an ordinary init container stay recorded as its own (and
in use), and are offered again to the containers after it (``devicesToReuse``): a later container
takes them first (``devicesToAllocate``) and kubelet still calls ``Allocate`` with them, so the
plugin answers twice for the same device IDs. A restartable init container (``restartPolicy:
Always``, a sidecar) keeps its devices to itself. PodResources ``List``
(pkg/kubelet/apis/podresources/server_v1.go) reports a pod's restartable init containers and its
regular containers, each with its own device IDs; ordinary init containers are not listed. Each
device ID comes in a ``ContainerDevices`` entry of its own (one per NUMA node, or one when the
plugin reports no topology, as gpushare's does: ``containerDevicesFromResourceDeviceInstances``
in pkg/kubelet/cm/container_manager.go), so a container's set is the union of its entries.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from gpushare.deviceplugin.kubelet.protos.podresources_v1 import api_pb2 as pr
from gpushare.deviceplugin.kubelet.protos.podresources_v1 import api_pb2_grpc as pr_grpc
from gpushare.deviceplugin.kubelet.protos.v1beta1 import api_pb2 as dp
from gpushare.deviceplugin.kubelet.protos.v1beta1 import api_pb2_grpc as dp_grpc


@dataclass
class Admitted:
    namespace: str
    name: str
    containers: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    """Device IDs per container (init containers too) and resource."""
    listed: list[str] = field(default_factory=list)
    """The containers PodResources reports: restartable init containers, then regular ones."""
    envs: dict[str, dict[str, str]] = field(default_factory=dict)
    mounts: dict[str, list[tuple[str, str, bool]]] = field(default_factory=dict)
    cdi_devices: dict[str, list[str]] = field(default_factory=dict)
    """CDI device names per container, every resource's answer's in turn (kubelet's device
    manager appends each response's ``CDIDevices`` to the container's run options)."""
    devices: dict[str, list[tuple[str, str, str]]] = field(default_factory=dict)
    """Device nodes per container (container path, host path, permissions), every resource's
    answer's in turn."""


class FakeKubelet(dp_grpc.RegistrationServicer, pr_grpc.PodResourcesListerServicer):
    def __init__(self, plugin_dir: Path, pod_resources_socket: Path) -> None:
        self.plugin_dir = plugin_dir
        self.pod_resources_socket = pod_resources_socket
        self.registrations: dict[str, str] = {}
        self.register_count = 0
        self.devices: dict[str, dict[str, str]] = {}
        self.admitted: dict[tuple[str, str], Admitted] = {}
        self._server: grpc.aio.Server | None = None
        self._podres: grpc.aio.Server | None = None
        self._watchers: dict[str, asyncio.Task[None]] = {}
        self._changed = asyncio.Event()

    async def start(self) -> None:
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        server = grpc.aio.server()
        dp_grpc.add_RegistrationServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.plugin_dir / 'kubelet.sock'}")
        await server.start()
        self._server = server
        if self._podres is None:
            podres = grpc.aio.server()
            pr_grpc.add_PodResourcesListerServicer_to_server(self, podres)
            podres.add_insecure_port(f"unix://{self.pod_resources_socket}")
            await podres.start()
            self._podres = podres

    async def stop(self) -> None:
        for task in self._watchers.values():
            task.cancel()
        for server in (self._server, self._podres):
            if server is not None:
                await server.stop(grace=0.1)

    async def restart(self) -> None:
        """Like a kubelet restart: the socket directory is wiped and kubelet.sock re-created."""
        if self._server is not None:
            await self._server.stop(grace=0.1)
        for task in self._watchers.values():
            task.cancel()
        self._watchers.clear()
        self.registrations.clear()
        for path in self.plugin_dir.iterdir():
            with contextlib.suppress(OSError):
                path.unlink()
        self._server = None
        await self.start()

    # -- Registration --------------------------------------------------------------------------

    async def Register(self, request: dp.RegisterRequest, context: Any) -> dp.Empty:
        assert request.version == "v1beta1"
        self.registrations[request.resource_name] = request.endpoint
        self.register_count += 1
        old = self._watchers.pop(request.resource_name, None)
        if old is not None:
            old.cancel()
        self._watchers[request.resource_name] = asyncio.create_task(
            self._follow(request.resource_name, request.endpoint)
        )
        return dp.Empty()

    def _channel(self, endpoint: str) -> grpc.aio.Channel:
        return grpc.aio.insecure_channel(f"unix://{self.plugin_dir / endpoint}")

    async def _follow(self, resource: str, endpoint: str) -> None:
        async with self._channel(endpoint) as channel:
            stub = dp_grpc.DevicePluginStub(channel)
            async for response in stub.ListAndWatch(dp.Empty()):
                self.devices[resource] = {d.ID: d.health for d in response.devices}
                self._changed.set()

    async def wait_devices(
        self, resource: str, count: int, healthy: int | None = None, timeout: float = 5
    ) -> dict[str, str]:
        async def ready() -> dict[str, str]:
            while True:
                devs = self.devices.get(resource, {})
                good = sum(h == "Healthy" for h in devs.values())
                if len(devs) == count and (healthy is None or good == healthy):
                    return devs
                self._changed.clear()
                await self._changed.wait()

        return await asyncio.wait_for(ready(), timeout)

    async def wait_listed(self, timeout: float = 10) -> None:
        """Until every registered resource's ListAndWatch has sent a device list: kubelet
        advertises a resource on the node only from that list, so no pod is bound to the node
        for it before (a test that binds and admits at once, on a loaded machine, would
        otherwise ask for devices this double has not heard of yet). Follows kubelet's
        ``pkg/kubelet/cm/devicemanager/manager.go``: the plugin's ListAndWatch updates fill
        its healthy devices (``genericDeviceUpdateCallback``), the node's capacity is read
        from them (``GetCapacity``), and an allocation past them is refused."""

        async def ready() -> None:
            while not self.registrations or any(
                not self.devices.get(resource) for resource in self.registrations
            ):
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(ready(), timeout)

    # -- admission -----------------------------------------------------------------------------

    def _in_use(self, resource: str) -> set[str]:
        used: set[str] = set()
        for pod in self.admitted.values():
            for per_resource in pod.containers.values():
                used.update(per_resource.get(resource, []))
        return used

    async def admit(self, pod: dict[str, Any]) -> Admitted:
        """Allocate every container of the pod, in order, one call per container and resource."""
        meta = pod["metadata"]
        admitted = Admitted(meta.get("namespace", "default"), meta["name"])
        self.admitted[(admitted.namespace, admitted.name)] = admitted
        spec = pod["spec"]
        inits = spec.get("initContainers", [])
        admitted.listed = [
            *(c["name"] for c in inits if c.get("restartPolicy") == "Always"),
            *(c["name"] for c in spec.get("containers", [])),
        ]
        reuse: dict[str, set[str]] = {}
        for container in [*inits, *spec.get("containers", [])]:
            chosen = await self._allocate(admitted, container, reuse)
            is_init = any(container is c for c in inits)
            for resource, ids in chosen.items():
                if is_init and container.get("restartPolicy") != "Always":
                    reuse.setdefault(resource, set()).update(ids)
                else:
                    reuse.setdefault(resource, set()).difference_update(ids)
        return admitted

    async def _allocate(
        self, admitted: Admitted, container: dict[str, Any], reuse: dict[str, set[str]]
    ) -> dict[str, list[str]]:
        """One container: reused devices first, then the plugin's preference among free ones."""
        limits = container.get("resources", {}).get("limits", {})
        envs: dict[str, str] = {}
        mounts: list[tuple[str, str, bool]] = []
        chosen_by_resource: dict[str, list[str]] = {}
        for resource, endpoint in sorted(self.registrations.items()):
            if resource not in limits:
                continue
            count = int(limits[resource])  # one device per unit of the limit, as kubelet
            chosen = sorted(reuse.get(resource, set()))[:count]
            async with self._channel(endpoint) as channel:
                stub = dp_grpc.DevicePluginStub(channel)
                if len(chosen) < count:
                    used = self._in_use(resource)
                    available = sorted(
                        d
                        for d, h in self.devices.get(resource, {}).items()
                        if h == "Healthy" and d not in used
                    )
                    preferred = await stub.GetPreferredAllocation(
                        dp.PreferredAllocationRequest(
                            container_requests=[
                                dp.ContainerPreferredAllocationRequest(
                                    available_deviceIDs=sorted({*available, *chosen}),
                                    must_include_deviceIDs=chosen,
                                    allocation_size=count,
                                )
                            ]
                        )
                    )
                    for device in [*preferred.container_responses[0].deviceIDs, *available]:
                        if len(chosen) == count:
                            break
                        if device in available and device not in chosen:
                            chosen.append(device)
                response = await stub.Allocate(
                    dp.AllocateRequest(
                        container_requests=[dp.ContainerAllocateRequest(devices_ids=chosen)]
                    )
                )
            admitted.containers.setdefault(container["name"], {})[resource] = chosen
            chosen_by_resource[resource] = chosen
            envs.update(response.container_responses[0].envs)
            admitted.cdi_devices.setdefault(container["name"], []).extend(
                d.name for d in response.container_responses[0].cdi_devices
            )
            mounts.extend(
                (m.container_path, m.host_path, m.read_only)
                for m in response.container_responses[0].mounts
            )
            admitted.devices.setdefault(container["name"], []).extend(
                (d.container_path, d.host_path, d.permissions)
                for d in response.container_responses[0].devices
            )
        if envs:
            admitted.envs[container["name"]] = envs
        if mounts:
            admitted.mounts[container["name"]] = mounts
        return chosen_by_resource

    def forget(self, namespace: str, name: str) -> None:
        self.admitted.pop((namespace, name), None)

    # -- PodResources --------------------------------------------------------------------------

    exclusive_cpus: tuple[int, ...] = ()
    """CPUs offered for exclusive use: none, as kubelet's CPU manager answers under its none
    policy (pkg/kubelet/cm/cpumanager/policy_none.go, GetAllocatableCPUs: an empty set); a
    test sets some to stand for the static policy."""

    async def GetAllocatableResources(
        self, request: pr.AllocatableResourcesRequest, context: Any
    ) -> pr.AllocatableResourcesResponse:
        return pr.AllocatableResourcesResponse(cpu_ids=list(self.exclusive_cpus))

    async def List(
        self, request: pr.ListPodResourcesRequest, context: Any
    ) -> pr.ListPodResourcesResponse:
        return pr.ListPodResourcesResponse(
            pod_resources=[
                pr.PodResources(
                    name=p.name,
                    namespace=p.namespace,
                    containers=[
                        pr.ContainerResources(
                            name=c,
                            devices=[
                                pr.ContainerDevices(resource_name=r, device_ids=[device])
                                for r, ids in p.containers.get(c, {}).items()
                                for device in ids
                            ],
                        )
                        for c in p.listed
                    ],
                )
                for p in self.admitted.values()
            ]
        )

    async def Get(
        self, request: pr.GetPodResourcesRequest, context: Any
    ) -> pr.GetPodResourcesResponse:
        raise NotImplementedError
