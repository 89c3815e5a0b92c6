"""The device plugin: the node side of sharing (kubelet's v1beta1 API over unix sockets).

It is one of gpushare's node drivers; what any node driver needs (the GPUs, preflight,
publishing, enforcement) is in ``gpushare.node``. Here, from top to bottom (lower ones never
import higher ones, an import-linter contract):

- ``plugin``: ``DevicePlugin``, the process for one node, its parts wired and started in order.
- ``kubelet``: the gRPC adapter (servicer, registration, device list, health, reconcile, protos).
- ``metrics``: the plugin's Prometheus metrics on ``--metrics-port``.
- ``readiness``: ``/healthz`` and ``/readyz`` on 127.0.0.1 (``--health-port``).
- ``allocating``: Allocate's reads and effects (the pods, the stranger wait, the hook, the
  checkpoint).
- ``answering``: the answer to one container, a pure function of what was read.
- ``checkpoint``: what was served per device-ID set, kept on disk across restarts.
- ``config``: what the plugin is told, and the counters its parts share.
"""
