"""kubelet's side of the DRA driver: the two gRPC services, on two unix sockets.

What kubelet v1.36.3 expects (checked in k8s.io/kubernetes v1.36.3 and k8s.io/kubelet v0.36.3):

- **Registration** (``pluginregistration.Registration``) on a socket in kubelet's
  ``<root-dir>/plugins_registry`` (``pkg/kubelet/kubeletconfig/defaults.go``,
  ``DefaultKubeletPluginsRegistrationDirName``). kubelet's plugin watcher
  (``pkg/kubelet/pluginmanager``) sees the socket appear, calls ``GetInfo`` and hands the answer
  to the handler of its ``type``: ``DRAPlugin`` (``pkg/apis/pluginregistration/v1/constants.go``).
  ``name`` is the driver's name, ``endpoint`` the DRA service's socket (kubelet dials
  ``unix:<endpoint>``, so an absolute path), and ``supported_versions`` lists gRPC services:
  kubelet picks the first it knows of ``v1.DRAPlugin`` and ``v1beta1.DRAPlugin``
  (``pkg/kubelet/cm/dra/plugin/dra_plugin.go``, ``servicesSupportedByKubelet``). It reports the
  outcome with ``NotifyRegistrationStatus``. When the socket goes, kubelet deregisters the driver.
- **DRAPlugin** (``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin``) on the endpoint, by convention
  ``<root-dir>/plugins/<driver>/dra.sock``: ``NodePrepareResources`` before a pod's containers
  start, ``NodeUnprepareResources`` once they are gone; each answers per claim UID, an error per
  claim, and kubelet calls again for a claim that failed or is missing.
- The health service ``v1alpha1.DRAResourceHealth`` is optional: kubelet (``ResourceHealthStatus``
  beta, on in 1.36) tries ``NodeWatchResources`` and, when the plugin does not serve it, logs and
  tries again every 5 s (``dra_plugin_manager.go``, ``add``). GPU health reaches the scheduler
  through the slice instead (an unhealthy GPU leaves it), so it is not served.

Only this module (and the generated stubs) speaks gRPC in the driver; what a claim gets is the
backend's (``driver.DraDriver``).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc

from gpushare.core.model.names import DRA_DRIVER
from gpushare.dra.preparing import PreparedDevice
from gpushare.dra.protos.dra_v1 import api_pb2 as dra
from gpushare.dra.protos.dra_v1 import api_pb2_grpc as dra_grpc
from gpushare.dra.protos.pluginregistration_v1 import api_pb2 as reg
from gpushare.dra.protos.pluginregistration_v1 import api_pb2_grpc as reg_grpc

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
SUPPORTED_SERVICES = ("v1.DRAPlugin",)
"""The gRPC services the driver serves, as registration names them: DRA's v1 API only."""


@dataclass(frozen=True)
class Sockets:
    """Where the two services listen."""

    registry_dir: Path
    """kubelet's ``plugins_registry`` directory."""
    plugin_dir: Path
    """The driver's own directory under kubelet's ``plugins``: its service socket is there."""

    @property
    def registration(self) -> Path:
        """The registration socket: ``<registry>/gpushare.io-reg.sock``."""
        return self.registry_dir / f"{DRA_DRIVER}-reg.sock"

    @property
    def service(self) -> Path:
        """The DRA service socket: ``<plugins>/gpushare.io/dra.sock``."""
        return self.plugin_dir / "dra.sock"


class Backend(Protocol):
    """What the services call: prepare and unprepare one claim, and note registration."""

    async def prepare(
        self, namespace: str, name: str, uid: str
    ) -> tuple[PreparedDevice, ...] | str:
        """The claim's devices, or why it cannot be prepared."""
        ...

    async def unprepare(self, namespace: str, name: str, uid: str) -> str | None:
        """Undo a prepare; why it failed, None when done (also for a claim never prepared)."""
        ...

    def registered(self, ok: bool, error: str) -> None:
        """kubelet's word on the registration."""
        ...


class RegistrationService(reg_grpc.RegistrationServicer):
    """``GetInfo`` and ``NotifyRegistrationStatus`` for kubelet's plugin watcher."""

    def __init__(self, backend: Backend, endpoint: Path) -> None:
        self.backend = backend
        self.endpoint = endpoint

    async def GetInfo(self, request: Any, context: Any) -> Any:
        """Say who the driver is and where its service is."""
        return reg.PluginInfo(
            type=PLUGIN_TYPE,
            name=DRA_DRIVER,
            endpoint=str(self.endpoint),
            supported_versions=list(SUPPORTED_SERVICES),
        )

    async def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        """Hear whether kubelet registered the driver."""
        self.backend.registered(bool(request.plugin_registered), str(request.error))
        return reg.RegistrationStatusResponse()


def _device(device: PreparedDevice) -> Any:
    return dra.Device(
        request_names=[device.request],
        pool_name=device.pool,
        device_name=device.device,
        cdi_device_ids=list(device.cdi_ids),
    )


class DraService(dra_grpc.DRAPluginServicer):
    """``NodePrepareResources`` and ``NodeUnprepareResources``, claim by claim."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        """Prepare each claim; a claim's failure is its own ``error``."""
        response = dra.NodePrepareResourcesResponse()
        for claim in request.claims:
            try:
                outcome = await self.backend.prepare(claim.namespace, claim.name, claim.uid)
            except Exception as err:  # a claim's failure must not fail the others
                log.exception("claim=%s/%s phase=prepare failed", claim.namespace, claim.name)
                outcome = f"gpushare.io: preparing failed: {type(err).__name__}: {err}"
            if isinstance(outcome, str):
                response.claims[claim.uid].error = outcome
            else:
                response.claims[claim.uid].devices.extend(_device(d) for d in outcome)
        return response

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        """Unprepare each claim; every claim asked gets an entry."""
        response = dra.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            try:
                error = await self.backend.unprepare(claim.namespace, claim.name, claim.uid)
            except Exception as err:
                log.exception("claim=%s/%s phase=unprepare failed", claim.namespace, claim.name)
                error = f"gpushare.io: unpreparing failed: {type(err).__name__}: {err}"
            response.claims[claim.uid].error = error or ""
        return response


class Servers:
    """The two gRPC servers: the service first, then the registration kubelet follows to it."""

    def __init__(self, backend: Backend, sockets: Sockets) -> None:
        self.backend = backend
        self.sockets = sockets
        self._servers: list[grpc.aio.Server] = []

    async def start(self) -> None:
        """Serve the DRA service, then the registration socket (kubelet then registers)."""
        await self.stop(grace=0.2)
        for path, add in (
            (self.sockets.service, self._add_service),
            (self.sockets.registration, self._add_registration),
        ):
            path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            server = grpc.aio.server()
            add(server)
            server.add_insecure_port(f"unix://{path}")
            await server.start()
            self._servers.append(server)
        log.info(
            "registration=%s service=%s phase=serve",
            self.sockets.registration,
            self.sockets.service,
        )

    def _add_service(self, server: grpc.aio.Server) -> None:
        dra_grpc.add_DRAPluginServicer_to_server(DraService(self.backend), server)

    def _add_registration(self, server: grpc.aio.Server) -> None:
        reg_grpc.add_RegistrationServicer_to_server(
            RegistrationService(self.backend, self.sockets.service), server
        )

    async def stop(self, grace: float) -> None:
        """Stop both servers; the registration socket goes first, so kubelet deregisters."""
        for server in reversed(self._servers):
            await server.stop(grace=grace)
        self._servers.clear()
        for path in (self.sockets.registration, self.sockets.service):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
