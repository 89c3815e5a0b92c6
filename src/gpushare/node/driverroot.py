"""A driver root on the host: where nodes without the NVIDIA container runtime keep the driver.

GKE's Container-Optimized OS has no NVIDIA container runtime. Its driver installer leaves the
user-space libraries under one host directory (``/home/kubernetes/bin/nvidia``, libraries in
``lib64/``), and GKE's own device plugin hands a GPU to a container by itself, with nothing for
a runtime hook to do. What that plugin answers kubelet, read from its source
(GoogleCloudPlatform/container-engine-accelerators: ``cmd/nvidia_gpu/nvidia_gpu.go``,
``pkg/gpu/nvidia/manager.go``, ``pkg/gpu/nvidia/beta_plugin.go``,
``cmd/nvidia_gpu/device-plugin.yaml``; facts only, the code is not copied):

- one device node per allocated GPU, ``/dev/nvidia<N>``, the same path on the host and in the
  container, with cgroup permissions ``mrw``;
- the shared nodes ``/dev/nvidiactl`` and ``/dev/nvidia-uvm`` (it waits for both before it
  serves) and ``/dev/nvidia-uvm-tools`` when the host has it;
- a read-only mount of ``-host-path`` (default ``/home/kubernetes/bin/nvidia``) at
  ``-container-path`` (default ``/usr/local/nvidia``), which CUDA images find through their
  ``LD_LIBRARY_PATH`` (``/usr/local/nvidia/lib64``);
- the plugin itself runs privileged with the host's ``/dev`` and the driver root mounted, and
  ``LD_LIBRARY_PATH=/usr/local/nvidia/lib64`` so that NVML loads.

gpushare's ``driver-root`` device-list strategy answers the same way for the GPUs it placed,
``<N>`` being NVML's minor number of each (``nvmlDeviceGetMinorNumber``, not its index: the two
differ when a GPU is hidden or the driver numbers them otherwise). Paths here are host paths, and
the chart mounts each at the same path in the plugin's container: kubelet hands the answer's host
paths to the runtime unchanged. The plugin also loads NVML from the driver root itself
(:func:`load_nvml`), so no ``LD_LIBRARY_PATH`` has to be set for it.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONTAINER_PATH = Path("/usr/local/nvidia")
"""Where containers see the driver root: GKE's convention, and what CUDA images' paths name."""
DEV_ROOT = Path("/dev")
NVML_NAME = "libnvidia-ml.so.1"
LIB_DIRS = ("lib64", "lib", "lib/x86_64-linux-gnu")
"""Where a driver root keeps its libraries: GKE's ``lib64`` first, then the usual layouts."""
SHARED_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")
"""Device nodes every GPU container needs besides its GPUs' own, when the host has them."""
PERMISSIONS = "mrw"
"""The device cgroup access kubelet grants a DeviceSpec: mknod, read, write."""

DeviceSpec = tuple[str, str, str]
"""A device node of an Allocate answer: container path, host path, cgroup permissions."""
Mount = tuple[str, str, bool]
"""A mount of an Allocate answer: container path, host path, read-only."""


class DriverRootError(RuntimeError):
    """The driver root cannot serve: the message names the paths tried and what to change."""


@dataclass(frozen=True)
class DriverRoot:
    """The host's driver directory and device nodes, and where containers see them."""

    host_path: Path
    """``--driver-root``: the driver's directory on the host (GKE: /home/kubernetes/bin/nvidia)."""
    container_path: Path = CONTAINER_PATH
    """``--driver-root-container-path``: where containers get it, read-only."""
    dev_root: Path = DEV_ROOT
    """``--dev-root``: the host directory of the device nodes (``/dev``)."""

    def nvml_candidates(self) -> tuple[Path, ...]:
        """The places NVML may be under the root, in the order they are tried."""
        return tuple(self.host_path / d / NVML_NAME for d in LIB_DIRS)

    def nvml_library(self) -> Path:
        """The driver root's NVML; DriverRootError names every path tried."""
        for path in self.nvml_candidates():
            if path.is_file():
                return path
        tried = ", ".join(str(p) for p in self.nvml_candidates())
        raise DriverRootError(
            f"--driver-root {self.host_path}: no {NVML_NAME} (tried {tried}). Point the "
            f"chart's devicePlugin.driverRoot.hostPath (--driver-root) at the directory the "
            f"driver installer fills (GKE: /home/kubernetes/bin/nvidia, whose lib64/ holds it), "
            f"mounted at the same path in the plugin"
        )

    def devices(self, minors: Sequence[int]) -> tuple[DeviceSpec, ...]:
        """The device nodes of a container given these GPUs: theirs, then the shared ones the
        host has (container paths under /dev, host paths under the dev root)."""
        names = [f"nvidia{m}" for m in minors]
        names += [n for n in SHARED_NODES if (self.dev_root / n).exists()]
        return tuple((f"/dev/{n}", str(self.dev_root / n), PERMISSIONS) for n in names)

    def mount(self) -> Mount:
        """The driver root, read-only at the container path."""
        return (str(self.container_path), str(self.host_path), True)

    def refusal(self, gpus: Sequence[tuple[str, int | None]]) -> str | None:
        """Why these GPUs (UUID, minor number) cannot be handed over; None when they can."""
        unknown = [uuid for uuid, minor in gpus if minor is None]
        if unknown:
            return (
                f"device-list strategy driver-root: NVML gave no minor number for GPU(s) "
                f"{', '.join(unknown)}, so their device nodes /dev/nvidia<minor> are not known; "
                f"use a driver whose NVML answers nvmlDeviceGetMinorNumber"
            )
        if not self.host_path.is_dir():
            return (
                f"device-list strategy driver-root: the driver root {self.host_path} is not a "
                f"directory here; mount the host's driver directory at the same path in the "
                f"plugin (the chart's devicePlugin.driverRoot.hostPath)"
            )
        missing = [
            f"{uuid} ({self.dev_root / f'nvidia{minor}'})"
            for uuid, minor in gpus
            if not (self.dev_root / f"nvidia{minor}").exists()
        ]
        if not missing:
            return None
        return (
            f"device-list strategy driver-root: no device node for GPU(s) {', '.join(missing)} "
            f"under --dev-root {self.dev_root}; the container runtime could not create those "
            f"containers. Mount the host's /dev at the same path in the plugin (the chart's "
            f"devicePlugin.driverRoot.devHostPath), and check that the driver is loaded "
            f"(ls -l /dev/nvidia*)"
        )


def load_nvml(root: DriverRoot, nvml: Any) -> Path:
    """Load the driver root's NVML into ``nvml`` (pynvml) before its own loader runs.

    pynvml loads ``libnvidia-ml.so.1`` by name on its first ``nvmlInit``, from the loader's
    search path, which in the plugin's container holds no driver. Loading the file by its path
    first, and handing pynvml the handle (its module-level ``nvmlLib``, which its loader keeps
    when set), makes every later call use it, with no ``LD_LIBRARY_PATH``.
    """
    path = root.nvml_library()
    try:
        handle = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    except OSError as err:
        raise DriverRootError(
            f"--driver-root {root.host_path}: cannot load {path}: {err}"
        ) from None
    nvml.nvmlLib = handle
    return path
