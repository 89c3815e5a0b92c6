"""kubelet's PodResources ``List`` for nodes without a kubelet (kwok), one socket per node.

The device plugin's served check reads PodResources to learn which pod kubelet admitted with
which device IDs. kwok nodes have no kubelet, so the API-request benchmark
(benchmarks/plugin_api_requests.py) answers for them with this double. What it copies from
kubelet (kubernetes/kubernetes), and nothing more:

- ``List`` answers every pod kubelet holds active on its node by namespace and name, with each
  regular container by name, and for each container the devices the device manager holds for
  (pod UID, container name), an empty list before there are any
  (pkg/kubelet/apis/podresources/server_v1.go, ``v1PodResourcesServer.List``:
  ``podsProvider.GetPods()``, ``pod.Spec.Containers``, ``devicesProvider.GetDevices``);
- the device manager holds a container's devices from the moment the plugin's ``Allocate``
  answered for them (pkg/kubelet/cm/devicemanager/manager.go, ``allocateContainerResources``:
  ``m.podDevices.insert(podUID, contName, resource, ...)`` right after the answer), so a pod the
  double was told is admitted lists its devices at once, and one not admitted lists none;
- a plugin that reports no topology gets each device ID in a ``ContainerDevices`` entry of its
  own (pkg/kubelet/cm/container_manager.go, ``containerDevicesFromResourceDeviceInstances``);
- a pod that left the node (deleted) is no longer listed (the pods provider gives the pods
  kubelet still holds).

Admission itself is the test's: ``admit`` records the pod's containers and device IDs (as many
as the container's limit of the resource, as kubelet's device manager asks for), as kubelet
would after its ``Allocate`` calls; ``forget`` drops it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from gpushare.deviceplugin.kubelet.protos.podresources_v1 import api_pb2 as pr
from gpushare.deviceplugin.kubelet.protos.podresources_v1 import api_pb2_grpc as pr_grpc


@dataclass
class ListedPod:
    namespace: str
    name: str
    containers: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    """Device IDs per regular container and resource name."""


class PodResourcesDouble(pr_grpc.PodResourcesListerServicer):
    """One node's PodResources ``List`` on a unix socket (see the module docstring)."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self.pods: dict[tuple[str, str], ListedPod] = {}
        self.lists = 0
        """``List`` calls answered."""
        self._server: grpc.aio.Server | None = None
        self._next_id = 0

    async def start(self) -> None:
        server = grpc.aio.server()
        pr_grpc.add_PodResourcesListerServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.socket}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=0.1)

    def admit(self, pod: dict[str, Any], resource: str) -> None:
        """Record the pod as kubelet does once each container's ``Allocate`` was answered."""
        meta = pod["metadata"]
        listed = ListedPod(meta["namespace"], meta["name"])
        for container in pod["spec"]["containers"]:
            limits = container.get("resources", {}).get("limits", {})
            count = int(limits.get(resource, 0))
            ids = []
            for _ in range(count):
                ids.append(f"dev-{self._next_id}")
                self._next_id += 1
            listed.containers[container["name"]] = {resource: ids} if ids else {}
        self.pods[(listed.namespace, listed.name)] = listed

    def forget(self, namespace: str, name: str) -> None:
        self.pods.pop((namespace, name), None)

    async def List(self, request: pr.ListPodResourcesRequest, context: Any) -> Any:
        self.lists += 1
        answer = pr.ListPodResourcesResponse()
        for pod in self.pods.values():
            entry = answer.pod_resources.add(namespace=pod.namespace, name=pod.name)
            for name, devices in pod.containers.items():
                container = entry.containers.add(name=name)
                for resource, ids in devices.items():
                    for device in ids:  # one entry per device ID: no topology
                        container.devices.add(resource_name=resource, device_ids=[device])
        return answer
