"""The device plugin process for one node: its parts, wired together and started in order.

Life cycle:

1. preflight (preflight.py): read the node, its pods and kubelet's allocatable CPUs at once;
   refuse to start when the configured unit differs from the node's while pods hold memory
   counted in it, or when the isolation hook cannot serve the node's mode
   (``ack.node.gpu.schedule``);
2. serve ``aliyun.com/gpu-mem`` (and ``aliyun.com/gpu-core.percentage`` on core_mem nodes) on
   their own sockets and register each with kubelet, again whenever ``kubelet.sock`` is
   re-created (registration.py, servicer.py): first, because kubelet fails the GPU pods it
   admits while no plugin is registered (docs/device-plugin.md, "Restarts");
3. publish the per-GPU inventory, the unit, the hand-off marker and (when it changed) how the
   GPUs are connected as node annotations, and ``aliyun.com/gpu-count`` in node status
   (publishing.py);
4. on a health change, send the new device list on every ListAndWatch stream and republish the
   inventory, so the scheduler stops placing pods on the GPU (health.py);
5. answer each ``Allocate`` from the pods bound to this node through the hand-off invariant,
   never by guessing, and keep what was served per device-ID set on disk (allocating.py,
   checkpoint.py); only allocations gpushare sealed for their pod count (core.records.trust), and a
   pod bound here that gpushare did not place is never served;
6. keep the node's pods from a field-selected list and watch (kube.podwatch): a quiet node
   costs kube-apiserver no request while the watch stays open;
7. when the watch or Allocate tells of a change (and every ``reconcile.RESYNC_S``), read
   kubelet's PodResources API and mark the admitted pods served, counting any that were served
   other than placed (reconcile.py);
8. when the node was born with the startup taint (``config.startup_taint``), remove it once
   kubelet allocates the GPU memory, so an autoscaler counts the node as starting until then
   rather than adding a second one (node/startuptaint.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from pathlib import Path

from gpushare.core.model.inventory import Mode
from gpushare.core.model.names import ANN_NODE_TOPOLOGY
from gpushare.core.model.startuptaint import Step, release
from gpushare.core.model.status import Status
from gpushare.core.records.handoff import MEM, Signature
from gpushare.core.records.trust import Trust
from gpushare.deviceplugin.allocating import Allocator, NodeParts, NodeReader
from gpushare.deviceplugin.checkpoint import ServedCheckpoint
from gpushare.deviceplugin.config import PluginConfig, Stats
from gpushare.deviceplugin.kubelet.devices import DeviceEntry, devices
from gpushare.deviceplugin.kubelet.health import Generations, watch_health
from gpushare.deviceplugin.kubelet.reconcile import ServedCheck, allocatable_cpus
from gpushare.deviceplugin.kubelet.registration import Registrar
from gpushare.kube.podwatch import NodePodWatch
from gpushare.kube.port import KubeAPI
from gpushare.kube.sealing import keyless_trust
from gpushare.kube.watchhealth import WatchHealth
from gpushare.node.enforcement.hook import ContainerAnswer, IsolationHook, NoIsolation
from gpushare.node.gpus import GpuSource
from gpushare.node.preflight import StartRefused, preflight, refuse_exclusive_cpus
from gpushare.node.publishing import publish
from gpushare.node.startuptaint import release_when_serving

log = logging.getLogger(__name__)

ROLE = (
    "the device plugin's ClusterRole (<release>-device-plugin, "
    "charts/gpushare/templates/deviceplugin-rbac.yaml)"
)
"""Where its verbs are granted, for the advice a refused watch logs."""


def process_age_s() -> float | None:
    """Seconds since this process was started (Linux ``/proc``), None where unknown.

    Logged when the plugin has registered: from a restart's exec to its registration is the
    window in which kubelet fails the GPU pods it admits, and most of it is spent before
    ``start`` runs (the interpreter, imports, NVML).
    """
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        booted = next(
            int(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, StopIteration, IndexError):
        return None
    return time.time() - (booted + int(fields[19]) / ticks)


class DevicePlugin:
    """Serves kubelet for one node."""

    def __init__(
        self,
        *,
        api: KubeAPI,
        source: GpuSource,
        config: PluginConfig,
        hook: IsolationHook | None = None,
        trust: Trust | None = None,
        stats: Stats | None = None,
    ) -> None:
        self.api = api
        self.source = source
        self.config = config
        self.hook = hook or NoIsolation()
        self.stats = stats or Stats()
        """The counters; the CLI makes them first, so the isolation hook's broker adds to them."""
        self.trust = trust if trust is not None else keyless_trust(api)
        self.pods = NodeReader(api=api, config=config, trust=self.trust, stats=self.stats)
        self.mode = Mode.SHARE
        self.resources: list[str] = [MEM]
        self.generations = Generations()
        self.checkpoint = ServedCheckpoint(config.state_dir / f"served-{config.node}.json")
        parts = NodeParts(
            api=api,
            config=config,
            hook=self.hook,
            checkpoint=self.checkpoint,
            stats=self.stats,
            pods=self.pods,
        )
        self.allocator = Allocator(parts, source=source)
        self.registrar = Registrar(backend=self, config=config, stats=self.stats)
        self.health = WatchHealth(role=ROLE)
        """Whether the API server refuses the pod watch (``/readyz``, metrics)."""
        self.watch = NodePodWatch(api, config.node, on_change=parts.changed.set, health=self.health)
        """The node's pods, from a list and a watch; the served check reads them."""
        self.served_check = ServedCheck(parts, watch=self.watch)
        self._tasks: list[asyncio.Task[None]] = []
        self._taint: asyncio.Task[object] | None = None
        """Removing the startup taint; apart from ``_tasks``, because it ends when done."""
        self._topology_on_node: str | None = None
        """``gpushare.io/gpu-topology`` as the node holds it, read at start, then as written."""

    # -- what each resource's DevicePlugin service asks for (servicer.Backend) -----------------

    async def wait_generation(self, seen: int) -> int:
        """Return the current device-list generation once it differs from ``seen``."""
        return await self.generations.wait(seen)

    def device_list(self, resource: str) -> list[DeviceEntry]:
        """The resource's devices as they are now."""
        return devices(resource, self.source.gpus(), self.config.unit)

    async def allocate(self, resource: str, device_ids: list[str]) -> ContainerAnswer | Status:
        """Answer one container."""
        return await self.allocator.allocate(resource, device_ids)

    # -- start and stop ------------------------------------------------------------------------

    async def start(self) -> None:
        """Check, serve and register every resource, publish the node, start the watchers.

        Raises StartRefused, before anything is published or served, when preflight refuses.

        Registration comes as early as the checks allow: from the moment a plugin's
        ListAndWatch stream ends, kubelet counts none of its devices healthy
        (``PluginDisconnected`` in pkg/kubelet/cm/devicemanager/manager.go) and fails every pod
        it admits that asks for them (``UnexpectedAdmissionError``, "no healthy devices
        present"), so a restart's gap is what loses pods. The three reads the checks need (the
        node, its pods, kubelet's allocatable CPUs) go out together, and publishing the node,
        which only the scheduler reads, follows registration (a restarted plugin finds its
        inventory published already).
        """
        began = time.monotonic()
        node, (pods, version), cpus = await asyncio.gather(
            self.api.get_node(self.config.node),
            self.api.list_pods(self.config.node),
            allocatable_cpus(self.config.pod_resources_socket),
        )
        self._topology_on_node = (node.get("metadata", {}).get("annotations") or {}).get(
            ANN_NODE_TOPOLOGY
        )
        read = time.monotonic()
        checked = preflight(
            node, pods, unit=self.config.unit, names=self.config.names, hook=self.hook
        )
        if checked.refused is not None:
            raise StartRefused(checked.refused)
        gpus = self.source.gpus()
        refused = refuse_exclusive_cpus(cpus or []) or self.config.handoff.refusal(
            [g.uuid for g in gpus], [g.minor for g in gpus]
        )
        if refused is not None:
            raise StartRefused(refused)
        self.mode, self.resources = checked.mode, checked.resources
        self.allocator.mode = checked.mode
        checked_at = time.monotonic()
        await self.generations.bump()
        await self.registrar.serve_and_register(self.resources)
        registered = time.monotonic()
        age = process_age_s()
        self.watch.replace(pods, version)  # the watch starts from preflight's list
        await self.publish()
        self._tasks = [
            asyncio.create_task(self.watch.run()),
            asyncio.create_task(self.registrar.watch_kubelet()),
            asyncio.create_task(watch_health(self.source, self.generations, self.publish)),
            asyncio.create_task(self.served_check.run(self.resources)),
        ]
        taint, mem = self.config.startup_taint, self.config.resource_name(MEM)
        if release(node, key=taint, resource=mem).step is not Step.DONE:
            self._taint = asyncio.create_task(
                release_when_serving(self.api, self.config.node, key=taint, resource=mem)
            )
        log.info(
            "node=%s mode=%s resources=%s gpus=%d phase=start read_s=%.3f checks_s=%.3f "
            "register_s=%.3f publish_s=%.3f registered_after_exec_s=%s",
            self.config.node,
            self.mode.value,
            ",".join(self.resources),
            len(self.source.gpus()),
            read - began,
            checked_at - read,
            registered - checked_at,
            time.monotonic() - registered,
            "unknown" if age is None else f"{age:.2f}",
        )

    async def stop(self) -> None:
        """Stop the watchers and the servers."""
        tasks = [*self._tasks, *([self._taint] if self._taint else [])]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.registrar.stop(grace=0.5)
        self.hook.close()

    async def publish(self) -> None:
        """Write the node's inventory, unit, hand-off marker, GPU count and topology."""
        self._topology_on_node = await publish(
            self.api, self.source, self.config, topology_on_node=self._topology_on_node
        )

    # -- reading back ----------------------------------------------------------------------------

    async def check_served(self) -> None:
        """Read PodResources once: mark pods served, count mismatches, let the hook prune."""
        await self.served_check.check(self.resources)

    def served_signature(self, device_ids: list[str]) -> Signature | None:
        """What Allocate answered for exactly these device IDs, if it did."""
        return self.checkpoint.signature(device_ids)

    def not_ready(self) -> str:
        """Why the plugin is not ready, '' when it is (``/readyz``, deviceplugin.readiness)."""
        if not self._tasks:
            return "starting: not registered with kubelet yet"
        stopped = [t for t in self._tasks if t.done()]
        if stopped:
            task = stopped[0]
            err = None if task.cancelled() else task.exception()
            return f"a background task stopped: {type(err).__name__ if err else 'cancelled'}: {err}"
        return self.health.problem()

    @property
    def mismatch_log(self) -> list[str]:
        """Each container served other than placed, as logged."""
        return self.served_check.mismatch_log
