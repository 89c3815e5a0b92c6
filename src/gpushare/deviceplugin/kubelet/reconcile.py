"""The served-check: which pod kubelet admitted, read back from PodResources, and marked served.

``Allocate`` never learns the pod. Afterwards kubelet's PodResources API tells, per pod (by
namespace and name) and container, which device IDs it got. Once every container kubelet lists for
a pod has its devices, what Allocate served for those IDs (the checkpoint) is compared with where
the pod was placed; a difference is counted and logged as a mismatch, and otherwise the pod is
marked served (``ALIYUN_COM_GPU_MEM_ASSIGNED=true``), which takes it out of the hand-off.

What kubelet reports, and so what the check expects (kubernetes/kubernetes):

- restartable init containers (sidecars) and regular containers, never ordinary init containers
  (pkg/kubelet/apis/podresources/server_v1.go, ``List``; see
  core.records.handoff.listed_signatures);
- each device ID in a ``ContainerDevices`` entry of its own, one per NUMA node
  (pkg/kubelet/cm/container_manager.go, ``containerDevicesFromResourceDeviceInstances``), so a
  container's set is the union of its entries;
- pods by namespace and name only: a pod re-created under its name (a StatefulSet's ``web-0``)
  is a new pod, so marked pods are remembered by the UID of the pod bound under that name now.

The same listing tells the isolation hook which pods and device sets are still live, so it can
drop the state of the others.

When to check. The node's pods come from the plugin's watch (kube.podwatch), so a check costs
kube-apiserver nothing but the marks it writes, and PodResources, a local call to kubelet, is
read only when something may have changed:

- at once when the watch shows a change of the node's pods (a pod bound here, its status
  written by kubelet, a pod deleted), or when Allocate answered (kubelet records the devices in
  PodResources as the answer comes back);
- then every ``check_interval`` while a pod placed here waits to be marked served, for at most
  :data:`FOLLOW_S` after the last change: kubelet admits a pod soon after it sees it bound, and
  its devices reach PodResources soon after its last Allocate, so a pod is marked as soon as it
  was under the old one-second poll; a pod kubelet never admits (its node is full, it was
  rejected) is not read for forever;
- otherwise every :data:`RESYNC_S`, the safety period: it repairs what no event told, such as
  a mark whose write failed, or isolation state of a container kubelet removed without any
  change of its pod. 60 s is what the isolation hook's own grace for pruning is
  (isolation.PRUNE_GRACE_S): a slower check would leave gone containers' state for longer than
  it does now.

A failed check (kubelet or the API server down) waits longer each time in a row (kube.backoff,
at least ``check_interval``), whatever changes meanwhile, so thousands of nodes do not ask every
second as it comes back; the first check that goes through brings the usual waits back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from gpushare.core.model.kubejson import KubeObject
from gpushare.core.model.names import ANN_ASSIGNED
from gpushare.core.records.allocation import Allocation
from gpushare.core.records.handoff import MEM, Signature, listed_signatures
from gpushare.core.records.trust import NodePods
from gpushare.deviceplugin.allocating import NodeParts, OnNode
from gpushare.deviceplugin.answering import spec_weight
from gpushare.deviceplugin.kubelet.protos.podresources_v1 import api_pb2 as pr
from gpushare.deviceplugin.kubelet.protos.podresources_v1 import api_pb2_grpc as pr_grpc
from gpushare.kube.backoff import Backoff
from gpushare.kube.podwatch import NodePodWatch
from gpushare.kube.port import KubeError

log = logging.getLogger(__name__)

RESYNC_S = 60.0
"""The safety period: the longest a check waits with nothing changed (see the module)."""
FOLLOW_S = 30.0
"""How long after the last change pods waiting to be marked are checked every interval."""


def next_check(*, waiting: bool, since_change: float, interval: float) -> float:
    """Seconds until the next check after one that went through (see the module docstring).

    ``since_change``: seconds since the watch or Allocate last told of a change.
    """
    if waiting and since_change < FOLLOW_S:
        return interval
    return max(interval, RESYNC_S)


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
        watch: NodePodWatch | None = None,
        backoff: Backoff | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(parts)
        self.watch = watch
        """Where the node's pods come from; None: a list at each check."""
        self.marked: set[str] = set()
        """UIDs of the pods marked served (their annotation may not have come back yet)."""
        self.mismatch_log: list[str] = []
        self.backoff = backoff if backoff is not None else Backoff()
        """Waits after failed checks (see the module docstring)."""
        self._sleep = sleep
        self._clock = clock
        self.waiting = False
        """After the last check: a pod placed here is not marked served yet."""

    async def _node_pods(self) -> tuple[NodePods, Mapping[str, KubeObject]]:
        """The node's pods, judged, and by UID: the watch's when it follows the server."""
        if self.watch is None:
            judged = await self.pods.read()
            return judged, self.pods.by_uid
        if not self.watch.current:
            raise KubeError(f"the watch of the pods bound to {self.config.node} is re-listing")
        return self.pods.judge(self.watch.objects()), self.watch.pods

    async def check(self, resources: Sequence[str]) -> None:
        """Read PodResources once and act on it."""
        listing = await list_pod_resources(self.config.pod_resources_socket)
        bound, by_uid = await self._node_pods()
        # trusted allocations only: an untrusted one is never marked served
        by_key = {(a.namespace, a.name): a for a in bound.allocations}
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
            self._weigh(pod, allocation.uid, by_uid.get(allocation.uid), mem_name)
            if allocation.assigned:
                continue
            verdict = check_pod(pod, allocation, resources=ours, served=self.checkpoint.signature)
            for message in verdict.mismatches:
                self.stats.mismatches += 1
                self.mismatch_log.append(message)
                log.error("phase=check mismatch: %s", message)
            if verdict.served and allocation.uid not in self.marked:
                await self._mark(allocation)
        self.waiting = any(not a.assigned and a.uid not in self.marked for a in bound.allocations)

    def _weigh(self, pod: ListedPod, uid: str, spec: KubeObject | None, mem_name: str) -> None:
        """Now that the pod is known, give each of its containers its own cGPU weight."""
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
        """Check when something changed, while pods wait, and every ``RESYNC_S``; back off
        while checks fail (see the module docstring)."""
        changed = self.changed
        last_change = self._clock()
        wait, wakeable = 0.0, True
        while True:
            if wait:
                await self._pause(wait, wakeable)
            if changed.is_set():
                changed.clear()
                last_change = self._clock()
            try:
                await self.check(resources)
            except (grpc.aio.AioRpcError, KubeError, OSError) as err:
                wait, wakeable = max(self.config.check_interval, self.backoff.failed()), False
                log.debug(
                    "PodResources check skipped (failure %d in a row, next in %.1fs): %s",
                    self.backoff.failures,
                    wait,
                    err,
                )
            else:
                self.backoff.reset()
                wait = next_check(
                    waiting=self.waiting,
                    since_change=self._clock() - last_change,
                    interval=self.config.check_interval,
                )
                wakeable = True

    async def _pause(self, seconds: float, wakeable: bool) -> None:
        """Sleep ``seconds``; a change ends the sleep early when ``wakeable``."""
        if not wakeable:
            await self._sleep(seconds)
            return
        sleeping = asyncio.ensure_future(self._sleep(seconds))
        woken = asyncio.ensure_future(self.changed.wait())
        try:
            await asyncio.wait((sleeping, woken), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (sleeping, woken):
                task.cancel()
