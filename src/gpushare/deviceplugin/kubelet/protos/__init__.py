"""gpushare's own copies of kubelet's gRPC APIs; ``genproto`` generates their stubs at build.

- ``v1beta1``: the device plugin API (``Registration``, ``DevicePlugin``).
- ``podresources_v1``: kubelet's PodResources API (``List``).
"""
