"""gpushare's own copies of kubelet's gRPC APIs; ``genproto`` generates their stubs at build.

- ``v1beta1``: the device plugin API (``Registration``, ``DevicePlugin``).
- ``podresources_v1``: kubelet's PodResources API (``List``).
- ``cri_v1``: the container runtime's CRI (``Version``, ``Status``), which kubelet speaks too;
  the plugin asks it whether the runtime applies its hand-off.
"""
