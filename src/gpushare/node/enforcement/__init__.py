"""Isolation hooks: what Allocate adds to a container so that its GPU share is enforced.

One hook per node mode (``ack.node.gpu.schedule``), picked when the plugin starts:

- on ``cgpu`` and ``core_mem`` nodes, :class:`InterposerIsolation` preloads the native interposer
  (``gpushare/isolation/native``) and gives each container its memory limit in bytes per visible
  GPU, its SM percentage on core_mem, and an account of its own in the plugin's accounting
  broker (``node.enforcement.broker``), through which the interposer counts usage across the
  container's processes.
- ``mps``: :class:`MpsIsolation` runs one NVIDIA MPS control daemon per GPU and points each
  container at its GPU's pipe directory, with MPS's own pinned-memory limit.
- ``share`` (and ``--isolation none``): :class:`~gpushare.node.enforcement.hook.NoIsolation`; the
  container gets the ``ALIYUN_COM_GPU_MEM_*`` variables only and limits itself
  (``gpushare.isolation.share``).

What the container cannot undo: the limits and the preload are files the plugin writes on the
host and mounts read-only, ``/etc/gpushare/limits`` (``gpushare.isolation.limits``; the
interposer reads it before the environment) and ``/etc/ld.so.preload`` (glibc's loader reads it
for every dynamically linked program, setuid ones included, whatever ``LD_PRELOAD`` says), so
neither a pod's own ``env`` nor a process that clears its children's environment turns the
limits off. The variables stay, for people. Usage is not the container's to write either: it is
kept by the broker, behind a socket whose directory is mounted read-only; each process's
connection is its account, given back when the process ends.

Mount sources are host paths: kubelet reads them on the host. The plugin creates the broker's
sockets and the pipe directories and copies the library through its own mounts, so the state
and library directories must be mounted at the same path in the plugin's container (the chart
does so).

Kubelet calls Allocate once per container and resource, and merges the answers: on core_mem
nodes the memory answer carries everything, so that the mounts are not given twice.

Kubelet does not say which pod it admits. When one pending container has the signature its
broker socket is ``<state>/broker/<pod-uid>/<container>/broker.sock`` (and its limits
``<state>/limits/<pod-uid>/<container>/limits``); when several identical ones wait, they are
named after kubelet's device IDs, which no two live containers share. Each Allocate starts the
account empty (kubelet calls it once per container, not on restarts); the plugin's PodResources
check closes the accounts and removes the directories of pods that are gone and of device sets
no longer in use, once they are a minute old. A restarted plugin serves every account again
from the limits files.

The MPS daemon commands run inside Allocate (which kubelet awaits anyway): at most one start per
GPU, and one liveness probe per container.

The modules, one per job, top first (an import-linter contract keeps lower ones from importing
higher ones):

- ``nodehook``: ``NodeIsolation``, the hook the plugin holds; picks one of the below per mode.
- ``interposer``: ``InterposerIsolation`` (cgpu, core_mem) with its cGPU schedules.
- ``mps``: ``MpsIsolation`` (mps), the containers' side of MPS.
- ``mpsdaemon``: ``MpsControl``, the MPS control daemon itself, behind ``DaemonRunner``.
- ``library``: installing the interposer library and the preload list on the host.
- ``mountcheck``: the OCI hook that refuses a container whose isolation mounts were moved, and
  its CDI spec.
- ``accounts``: each container's state directory, and pruning those of gone containers.
- ``broker``: the accounting broker, each container's usage account on a socket, and its
  counters.
- ``hook``: the contract every hook keeps (``IsolationHook``), what it extends
  (``ContainerAnswer``, ``Target``), and ``NoIsolation``.
"""
