"""The container runtime's CRI, asked once at start what it does with CDI devices.

A thin adapter: it makes the two calls ``node.handoffproof`` decides from (``Version`` for the
runtime's name, ``Status`` with ``verbose`` for containerd's CRI configuration) on the socket
kubelet itself uses, and turns every way of not getting an answer (no socket, refused, timed
out, unimplemented) into :attr:`RuntimeAnswer.unanswered` words rather than an exception: a
runtime that cannot be asked must not stop the plugin, only leave it unable to tell.
"""

from __future__ import annotations

import stat
from pathlib import Path

import grpc

from gpushare.deviceplugin.kubelet.protos.cri_v1 import api_pb2 as cri
from gpushare.deviceplugin.kubelet.protos.cri_v1 import api_pb2_grpc as cri_grpc
from gpushare.node.handoffproof import RuntimeAnswer

TIMEOUT_S = 5.0
"""Per call: containerd answers both from memory."""


def ask_runtime(socket: Path, *, timeout_s: float = TIMEOUT_S) -> RuntimeAnswer:
    """The runtime's name, version and verbose ``Status`` info, or why there is none."""
    try:
        if not stat.S_ISSOCK(socket.stat().st_mode):
            return RuntimeAnswer(unanswered=f"{socket} is not a socket")
    except OSError as err:
        return RuntimeAnswer(
            unanswered=f"no CRI socket at {socket} ({err.strerror}): not mounted, or the node "
            "runs another runtime (CRI-O: /var/run/crio/crio.sock; k3s and RKE2: "
            "/run/k3s/containerd/containerd.sock; the chart's devicePlugin.criSocketPath)"
        )
    try:
        with grpc.insecure_channel(f"unix://{socket}") as channel:
            stub = cri_grpc.RuntimeServiceStub(channel)
            version = stub.Version(cri.VersionRequest(version="v1"), timeout=timeout_s)
            status = stub.Status(cri.StatusRequest(verbose=True), timeout=timeout_s)
    except grpc.RpcError as err:
        code = err.code().name if isinstance(err, grpc.Call) else type(err).__name__
        details = err.details() if isinstance(err, grpc.Call) else str(err)
        return RuntimeAnswer(unanswered=f"the CRI runtime at {socket} answered {code}: {details}")
    return RuntimeAnswer(
        name=version.runtime_name,
        version=version.runtime_version,
        info=dict(status.info),
    )
