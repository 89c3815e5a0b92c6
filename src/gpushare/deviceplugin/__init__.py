"""The device plugin: the node side of sharing (kubelet's v1beta1 API over unix sockets).

It is one of gpushare's node drivers; what any node driver needs (the GPUs, preflight,
publishing, enforcement) is in ``gpushare.node``. Here, from top to bottom (lower ones never
import higher ones, an import-linter contract):

- ``plugin``: ``DevicePlugin``, the process for one node, its parts wired and started in order.
- ``kubelet``: the gRPC adapter (servicer, registration, device list, health, reconcile, protos);
  ``metrics`` and ``readiness``: its HTTP ports.
- ``allocating``: Allocate's reads and effects (the pods, the stranger wait, the hook, the
  checkpoint).
- ``answering``: the answer to one container, a pure function of what was read;
  ``checkpoint``: what was served per device-ID set; ``config``: what the plugin is told and its
  counters.
"""
