"""kubelet's ``v1beta1.DevicePlugin`` service for one resource: translation to and from gRPC.

The decisions live elsewhere (the device list in serving.py, the answer in allocating.py); this
adapter turns them into protobuf messages and a refusal into ``FAILED_PRECONDITION``, which
kubelet reports on the pod. ``GetPreferredAllocation`` keeps kubelet's must-include devices and
adds the lowest free IDs: which IDs a container gets does not matter to gpushare, only how many.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

import grpc

from gpushare.core.model.status import Status
from gpushare.deviceplugin.kubelet.devices import HEALTHY, UNHEALTHY, DeviceEntry
from gpushare.deviceplugin.kubelet.protos.v1beta1 import api_pb2 as dp
from gpushare.deviceplugin.kubelet.protos.v1beta1 import api_pb2_grpc as dp_grpc
from gpushare.node.enforcement.hook import ContainerAnswer


def plugin_options() -> dp.DevicePluginOptions:
    """What the plugin offers kubelet: preferred allocations, no PreStartContainer call."""
    return dp.DevicePluginOptions(get_preferred_allocation_available=True)


class Backend(Protocol):
    """What the service needs from the plugin."""

    async def wait_generation(self, seen: int) -> int:
        """Return the current device-list generation once it differs from ``seen``."""
        ...

    def device_list(self, resource: str) -> list[DeviceEntry]:
        """The resource's devices as they are now."""
        ...

    async def allocate(self, resource: str, device_ids: list[str]) -> ContainerAnswer | Status:
        """Answer one container."""
        ...


def allocate_response(answer: ContainerAnswer) -> dp.ContainerAllocateResponse:
    """One container's answer as kubelet reads it."""
    return dp.ContainerAllocateResponse(
        envs=dict(answer.envs),
        annotations=dict(answer.annotations),
        mounts=[dp.Mount(container_path=c, host_path=h, read_only=r) for c, h, r in answer.mounts],
        cdi_devices=[dp.CDIDevice(name=n) for n in answer.cdi_devices],
        devices=[
            dp.DeviceSpec(container_path=c, host_path=h, permissions=p)
            for c, h, p in answer.devices
        ],
    )


class DevicePluginService(dp_grpc.DevicePluginServicer):
    """One resource's DevicePlugin service."""

    def __init__(self, backend: Backend, resource: str) -> None:
        self.backend = backend
        self.resource = resource

    async def GetDevicePluginOptions(
        self, request: dp.Empty, context: Any
    ) -> dp.DevicePluginOptions:
        return plugin_options()

    async def ListAndWatch(
        self, request: dp.Empty, context: Any
    ) -> AsyncIterator[dp.ListAndWatchResponse]:
        generation = -1
        while True:
            generation = await self.backend.wait_generation(generation)
            entries = self.backend.device_list(self.resource)
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
            answer = await self.backend.allocate(self.resource, list(ask.devices_ids))
            if isinstance(answer, Status):  # abort raises: kubelet gets the reason
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, answer.attributed)
            else:
                responses.append(allocate_response(answer))
        return dp.AllocateResponse(container_responses=responses)

    async def PreStartContainer(
        self, request: dp.PreStartContainerRequest, context: Any
    ) -> dp.PreStartContainerResponse:
        return dp.PreStartContainerResponse()
