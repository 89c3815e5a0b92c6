"""The node: what a node driver of gpushare works with, whichever API it serves kubelet through.

Its drivers are kubelet's device plugin (``gpushare.deviceplugin``) and the DRA driver
(``gpushare.dra``). Nothing here speaks kubelet's gRPC or knows device IDs: it reads the node's
GPUs, checks the node before serving, publishes what the scheduler reads, and enforces a
container's share.

The modules, one concept each (lower ones never import higher ones, an import-linter contract):

- ``preflight``: whether the node may be served at all (mode label, unit change, CPU manager).
- ``handoffproof``: whether the container runtime applies the hand-off (containerd's CDI
  setting, the NVIDIA toolkit's), decided at start from what they report.
- ``containerproof``: what a GPU container got of the hand-off, checked from inside it.
- ``handout``: what a container is handed for its share (environment, CDI devices, device
  nodes), the same for both drivers.
- ``enforcement``: the isolation hooks that make a container keep to its share, and the
  accounting broker (its own map in its ``__init__``).
- ``publishing``: the inventory, unit, hand-off marker, model labels and topology on the node.
- ``usage``: the GPU memory containers hold, summarised on the node (``gpushare.io/gpu-used``).
- ``startuptaint``: removing the autoscaler's startup taint once kubelet allocates the GPU memory.
- ``descriptors``: the open-file budget the accounting broker's connections live within.
- ``cdi``: the device-list strategy and the node's CDI specs.
- ``hostpaths``: whether the interposer's and the state's host directories are writable (and
  exec-mappable), checked at start.
- ``gpus``: where the GPUs come from (NVML, or fakes), behind the ``GpuSource`` port.
- ``interconnect``: how NVML says the GPUs are connected.
- ``driverroot``: the host's driver directory and device nodes (the ``driver-root`` hand-off),
  and NVML loaded from it.
"""
