"""How Kubernetes adds up its containers' amounts into the pod's, for any resource.

Init containers run one at a time before the app containers, so each needs its own amount
only beside the sidecars (init containers with ``restartPolicy: Always``) started before it;
sidecars keep running and add to everything after them; app containers add up. The pod needs
the larger of the init peak and the running total (``resource.PodRequests`` in
k8s.io/component-helpers/resource/helpers.go). GPU memory, computing power, CPU and host memory
are all counted this one way.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum


class ContainerKind(Enum):
    """Where a container sits in the pod, which decides how Kubernetes counts it."""

    APP = "app"
    INIT = "init"
    SIDECAR = "sidecar"


def counted(values: Iterable[tuple[ContainerKind, int]]) -> int:
    """What containers' amounts, in spec order, add up to as Kubernetes counts a pod."""
    running_sidecars = 0
    peak = 0
    app_total = 0
    for kind, value in values:
        if kind is ContainerKind.APP:
            app_total += value
        elif kind is ContainerKind.SIDECAR:
            peak = max(peak, running_sidecars + value)
            running_sidecars += value
        else:
            peak = max(peak, running_sidecars + value)
    return max(peak, app_total + running_sidecars)
