"""The device plugin: the node side of sharing (kubelet's v1beta1 API over unix sockets).

- ``plugin``: the process for one node, its parts wired together and started in order.
- ``config``: what one node's plugin is told, and the counters its parts share.
- ``preflight``: whether the plugin may start on this node, before it serves anything.
- ``gpus``: where the GPUs come from: NVML on a real node, or a fake backend.
- ``interconnect``: how the GPUs are connected, read from NVML into topology distances.
- ``publishing``: what the scheduler reads from the node (GPUs, memory unit, hand-off marker).
- ``serving``: what the plugin advertises and what Allocate answers (pure, no gRPC).
- ``allocating``: Allocate's answer for one container, from the pods bound to this node.
- ``cdi``: how Allocate hands the placed GPUs to a container (the device-list strategies).
- ``checkpoint``: what Allocate served, kept on disk across restarts.
- ``hooks``: the isolation Allocate adds to a container, one hook per node mode.
- ``broker``: the accounting broker, each container's GPU memory usage on a socket.
- ``usage``: what each container uses on its GPUs beside its allocation.
- ``descriptors``: the plugin's file descriptors, its own and what tenants may have.
- ``servicer``: kubelet's ``v1beta1.DevicePlugin`` service for one resource (gRPC).
- ``registration``: each resource on its own socket, registered with kubelet, and again.
- ``reconcile``: the served check, read back from PodResources.
- ``health``: device-list generations, what ListAndWatch waits on.
- ``readiness``: ``/healthz`` and ``/readyz`` on 127.0.0.1 (``--health-port``).
- ``metrics``: the plugin's Prometheus metrics on ``--metrics-port``.
- ``protos``: gpushare's own copies of kubelet's ``.proto`` files; stubs generated at build.
- ``genproto``: generate the gRPC stubs from those copies.
"""
