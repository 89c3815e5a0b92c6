"""The served-check: which pod kubelet admitted, read back from PodResources, and marked served.

``Allocate`` never learns the pod. Afterwards kubelet's PodResources API tells, per pod (by
namespace and name) and container, which device IDs it got. Once every container kubelet lists for
a pod has its devices, what Allocate served for those IDs (the checkpoint) is compared with where
the pod was placed; a difference is counted and logged as a mismatch, and otherwise the pod is
marked served (``ALIYUN_COM_GPU_MEM_ASSIGNED=true``), which takes it out of the hand-off.

What kubelet reports, and so what the check expects (kubernetes/kubernetes):

- restartable init containers (sidecars) and regular containers, never ordinary init containers
  (pkg/kubelet/apis/podresources/server_v1.go, ``List``; see core.handoff.listed_signatures);
- each device ID in a ``ContainerDevices`` entry of its own, one per NUMA node
  (pkg/kubelet/cm/container_manager.go, ``containerDevicesFromResourceDeviceInstances``), so a
  container's set is the union of its entries;
- pods by namespace and name only: a pod re-created under its name (a StatefulSet's ``web-0``)
  is a new pod, so marked pods are remembered by the UID of the pod bound under that name now.

The same listing tells the isolation hook which pods and device sets are still live, so it can
drop the state of the others.

Every node's plugin lists its pods each ``check_interval``; with the API server or kubelet
down that is thousands of nodes asking every second as it comes back. A failed check therefore
waits longer each time in a row (kube.backoff, at least ``check_interval``), and the first check
that goes through brings the interval back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from gpushare.core.allocation import Allocation
from gpushare.core.handoff import MEM, Signature, listed_signatures
from gpushare.core.names import ANN_ASSIGNED
from gpushare.deviceplugin.allocating import NodeParts, OnNode, spec_weight
from gpushare.deviceplugin.protos.podresources_v1 import api_pb2 as pr
from gpushare.deviceplugin.protos.podresources_v1 import api_pb2_grpc as pr_grpc
from gpushare.kube.backoff import Backoff
from gpushare.kube.port import KubeError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ListedPod:
    """One pod as PodResources reports it: device IDs by (container, resource name)."""

    namespace: str
    name: str
    devices: Mapping[tuple[str, str], frozenset[str]]


async def list_pod_resources(socket: Path) -> list[ListedPod]:
    """kubelet's PodResources ``List``, each container's entries joined per resource."""
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        listing = await pr_grpc.PodResourcesListerStub(channel).List(
            pr.ListPodResourcesRequest(), timeout=10
        )
    out = []
    for pod in listing.pod_resources:
        devices: dict[tuple[str, str], set[str]] = {}
        for container in pod.containers:
            for entry in container.devices:
                key = (container.name, entry.resource_name)
                devices.setdefault(key, set()).update(entry.device_ids)
        out.append(
            ListedPod(pod.namespace, pod.name, {k: frozenset(v) for k, v in devices.items()})
        )
    return out


async def allocatable_cpus(socket: Path) -> list[int] | None:
    """kubelet's PodResources ``GetAllocatableResources`` CPUs; None where kubelet cannot say.

    GA since Kubernetes 1.28 (``KubeletPodResourcesGetAllocatable``); an older or restricted
    kubelet answers UNIMPLEMENTED, and then the plugin cannot tell the CPU manager's policy.
    """
    try:
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            answer = await pr_grpc.PodResourcesListerStub(channel).GetAllocatableResources(
                pr.AllocatableResourcesRequest(), timeout=10
            )
    except grpc.aio.AioRpcError as err:
        log.warning("phase=preflight kubelet's allocatable CPUs unknown: %s", err.code().name)
        return None
    return list(answer.cpu_ids)


@dataclass(frozen=True)
class PodCheck:
    """What the listing says about one bound pod."""

    admitted: bool
    """Every container kubelet lists for the pod has its devices."""
    mismatches: tuple[str, ...] = ()

    @property
    def served(self) -> bool:
        """Admitted, and served where it was placed."""
        return self.admitted and not self.mismatches


def check_pod(
    pod: ListedPod,
    allocation: Allocation,
    *,
    resources: Mapping[str, str],
    served: Callable[[list[str]], Signature | None],
) -> PodCheck:
    """Compare a listed pod with its allocation; ``resources`` maps resource names to ours.

    A container whose devices the checkpoint does not know (it was lost) is not a mismatch.
    """
    got = {
        (container, resources[name]): sorted(ids)
        for (container, name), ids in pod.devices.items()
        if name in resources
    }
    expected = listed_signatures(allocation)
    if set(expected) - set(got):
        return PodCheck(admitted=False)
    mismatches = []
    for (container, resource), signature in expected.items():
        was = served(got[(container, resource)])
        if was is not None and was != signature:
            mismatches.append(
                f"pod {allocation.key} container {container} was served {was.layout} "
                f"but placed on {signature.layout}"
            )
    return PodCheck(admitted=True, mismatches=tuple(mismatches))


class ServedCheck(OnNode):
    """Marks admitted pods served, counts mismatches, lets the isolation hook prune."""

    def __init__(
        self,
        parts: NodeParts,
        *,
        backoff: Backoff | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        super().__init__(parts)
        self.marked: set[str] = set()
        """UIDs of the pods marked served (their annotation may not have come back yet)."""
        self.mismatch_log: list[str] = []
        self.backoff = backoff if backoff is not None else Backoff()
        """Waits after failed checks (see the module docstring)."""
        self._sleep = sleep

    async def check(self, resources: Sequence[str]) -> None:
        """Read PodResources once and act on it."""
        listing = await list_pod_resources(self.config.pod_resources_socket)
        # trusted allocations only: an untrusted one is never marked served
        by_key = {(a.namespace, a.name): a for a in (await self.pods.read()).allocations}
        self.marked &= {a.uid for a in by_key.values()}  # forget pods that are gone
        ours = {self.config.resource_name(r): r for r in resources}
        mem_name = self.config.resource_name(MEM)
        self.hook.prune(
            frozenset(a.uid for a in by_key.values()),
            frozenset(
                tuple(sorted(ids))
                for pod in listing
                for (_, name), ids in pod.devices.items()
                if name == mem_name
            ),
        )
        for pod in listing:
            allocation = by_key.get((pod.namespace, pod.name))
            if allocation is None:
                continue
            self._weigh(pod, allocation.uid, mem_name)
            if allocation.assigned:
                continue
            verdict = check_pod(pod, allocation, resources=ours, served=self.checkpoint.signature)
            for message in verdict.mismatches:
                self.stats.mismatches += 1
                self.mismatch_log.append(message)
                log.error("phase=check mismatch: %s", message)
            if verdict.served and allocation.uid not in self.marked:
                await self._mark(allocation)

    def _weigh(self, pod: ListedPod, uid: str, mem_name: str) -> None:
        """Now that the pod is known, give each of its containers its own cGPU weight."""
        spec = self.pods.by_uid.get(uid)
        for (container, name), ids in pod.devices.items():
            if name == mem_name:
                reading = spec_weight(spec, container, self.config.max_pods)
                self.hook.weigh(uid, container, tuple(sorted(ids)), reading.weight)

    async def _mark(self, allocation: Allocation) -> None:
        try:
            await self.api.patch_pod_annotations(
                allocation.namespace, allocation.name, {ANN_ASSIGNED: "true"}, resource_version=""
            )
        except KubeError as err:
            log.warning("pod=%s cannot mark served: %s", allocation.key, err)
            return
        self.marked.add(allocation.uid)
        self.stats.served_pods += 1

    async def run(self, resources: Sequence[str]) -> None:
        """Check every ``check_interval`` seconds, backing off while checks fail."""
        wait = self.config.check_interval
        while True:
            await self._sleep(wait)
            try:
                await self.check(resources)
            except (grpc.aio.AioRpcError, KubeError, OSError) as err:
                wait = max(self.config.check_interval, self.backoff.failed())
                log.debug(
                    "PodResources check skipped (failure %d in a row, next in %.1fs): %s",
                    self.backoff.failures,
                    wait,
                    err,
                )
            else:
                self.backoff.reset()
                wait = self.config.check_interval
