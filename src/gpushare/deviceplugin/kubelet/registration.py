"""Each resource on its own socket, registered with kubelet, and again after kubelet restarts.

kubelet serves ``v1beta1.Registration`` on ``<plugin_dir>/kubelet.sock``; a plugin serves its
resource on a socket of its own in the same directory and registers that endpoint's file name.
On restart kubelet wipes the directory and creates ``kubelet.sock`` anew, and forgets every
plugin. The plugin cannot be told, so it polls the socket's identity: the inode number alone can
be reused at once, the inode's change time cannot. On a new identity every resource is served
and registered again; a failed registration is retried on the next poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path

import grpc

from gpushare.deviceplugin.config import PluginConfig, Stats
from gpushare.deviceplugin.kubelet.protos.v1beta1 import api_pb2 as dp
from gpushare.deviceplugin.kubelet.protos.v1beta1 import api_pb2_grpc as dp_grpc
from gpushare.deviceplugin.kubelet.servicer import Backend, DevicePluginService, plugin_options

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
POLL_S = 0.2
"""How often kubelet.sock is looked at; re-registration follows a kubelet restart this fast."""


def socket_identity(path: Path) -> tuple[int, int]:
    """The socket's (inode, change time); (0, 0) while it does not exist."""
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return (0, 0)
    return (stat.st_ino, stat.st_ctime_ns)


class Registrar:
    """Owns the resources' gRPC servers and their registrations."""

    def __init__(self, *, backend: Backend, config: PluginConfig, stats: Stats) -> None:
        self.backend = backend
        self.config = config
        self.stats = stats
        self.resources: list[str] = []
        self._servers: dict[str, grpc.aio.Server] = {}

    async def serve_and_register(self, resources: list[str]) -> None:
        """(Re)create each resource's socket and register it with kubelet."""
        await self.stop(grace=0.2)
        self.resources = list(resources)
        self.config.plugin_dir.mkdir(parents=True, exist_ok=True)
        for resource in self.resources:
            path = self.config.plugin_dir / self.config.endpoint(resource)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            server = grpc.aio.server()
            dp_grpc.add_DevicePluginServicer_to_server(
                DevicePluginService(self.backend, resource), server
            )
            server.add_insecure_port(f"unix://{path}")
            await server.start()
            self._servers[resource] = server
        for resource in self.resources:
            await self.register(resource)

    async def register(self, resource: str) -> None:
        """Tell kubelet where a resource is served."""
        name, endpoint = self.config.resource_name(resource), self.config.endpoint(resource)
        async with grpc.aio.insecure_channel(f"unix://{self.config.kubelet_socket}") as channel:
            await dp_grpc.RegistrationStub(channel).Register(
                dp.RegisterRequest(
                    version=API_VERSION,
                    endpoint=endpoint,
                    resource_name=name,
                    options=plugin_options(),
                ),
                timeout=10,
            )
        self.stats.registrations += 1
        log.info("resource=%s endpoint=%s phase=register", name, endpoint)

    async def watch_kubelet(self) -> None:
        """Serve and register again whenever kubelet.sock is re-created."""
        current = socket_identity(self.config.kubelet_socket)
        while True:
            await asyncio.sleep(POLL_S)
            now = socket_identity(self.config.kubelet_socket)
            if now[0] and now != current:
                log.info("kubelet.sock re-created; serving and registering again")
                try:
                    await self.serve_and_register(self.resources)
                    current = now
                except grpc.aio.AioRpcError as err:
                    log.warning("re-registration failed, will retry: %s", err.details())
            elif not now[0]:
                current = (0, 0)

    async def stop(self, grace: float) -> None:
        """Stop every resource's server."""
        for server in self._servers.values():
            await server.stop(grace=grace)
        self._servers.clear()
