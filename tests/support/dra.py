"""DRA mode on the loopback cluster: ``gpushare webhook --dra`` with the chart's identity, DRA
objects and policies; the claims of a namespace watched; what a converted pod's container must
see, from its claim.

The webhook runs here (not in a pod), its MutatingWebhookConfiguration pointed at its URL; the
chart's ServiceAccount, RBAC, DeviceClass, claim policy and hand-off policy are applied as
``helm template`` renders them with ``dra.enabled``. Whether the pods it converts wait behind
the gate ``gpushare.io/dra-allocation`` (for ``gpushare extender --dra-allocator``) or not
(``--dra-no-gate``, the stock allocator) is the caller's choice.

A claim made from a template lives as long as its pod, and kube-controller-manager deallocates
and deletes it once the pod has finished; a pod that runs for a moment can be gone from the
claim's point of view before a poll reads it. :class:`ClaimWatch` therefore keeps every
allocation a watch delivered, and checks at each event that no GPU holds more memory than it
has.
"""

from __future__ import annotations

import base64
import contextlib
import json
import ssl
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from gpushare.core.model.quantity import parse_quantity
from harness.cluster import Cluster, Process, wait_for
from harness.identities import apply_chart_identities, chart_documents, service_account_kubeconfig
from harness.ports import free_port
from harness.realnode import RealNode
from tests.support.pki import serving_pki

DRA_VALUES = ("--set", "dra.enabled=true", "--set", "webhook.steer.enabled=false")
"""The chart's values for DRA mode as these tests run it (the webhook's steering is another
part, off so the conversion is all it does)."""
MODE_LABEL = "gpushare.io/allocation-mode"
CLAIM = "gpushare"
"""The name of the claim the webhook puts in a converted pod (``pod.spec.resourceClaims``)."""
MEM = "aliyun.com/gpu-mem"
WATCH_JSON = ("--output-watch-events", "-o", "json")


@dataclass
class DraWebhook:
    """The running webhook and what was applied for it (removed again on exit)."""

    process: Process
    url: str
    documents: list[dict[str, Any]]


def _apply(cluster: Cluster, *objects: dict[str, Any]) -> None:
    body = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})
    cluster.kubectl("apply", "-f", "-", input=body)


def probe_pod(namespace: str) -> dict[str, Any]:
    """A pod as a tenant writes it for ACK (1 GiB), for a dry run that shows the conversion."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "probe", "namespace": namespace},
        "spec": {
            "containers": [{"name": "main", "image": "busybox", "resources": {"limits": {MEM: 1}}}],
        },
    }


@contextlib.contextmanager
def dra_webhook(
    cluster: Cluster,
    root: Path,
    *,
    probe_namespace: str,
    gate: bool = True,
    unit: str = "1GiB",
) -> Iterator[DraWebhook]:
    """``gpushare webhook --dra`` with the chart's identity, its MutatingWebhookConfiguration,
    DeviceClass and policies applied; yielded once a server-side dry run of a GPU pod in
    ``probe_namespace`` (labelled for DRA mode by the caller) comes back converted. ``gate``
    False runs it with ``--dra-no-gate``."""
    apply_chart_identities(cluster)
    claims_docs = chart_documents(cluster, ("templates/dra-claims.yaml",), values=DRA_VALUES)
    webhook_docs = chart_documents(cluster, ("templates/webhook.yaml",), values=DRA_VALUES)
    config_docs = chart_documents(
        cluster, ("templates/webhook-configuration.yaml",), values=DRA_VALUES
    )
    policy_docs = chart_documents(cluster, ("templates/webhook-policy.yaml",), values=DRA_VALUES)
    identity = [
        d
        for d in webhook_docs
        if d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")
    ]
    account = next(d for d in identity if d["kind"] == "ServiceAccount")["metadata"]["name"]
    _apply(cluster, *identity)
    kubeconfig = service_account_kubeconfig(cluster, account, root / "webhook.kubeconfig")
    ca, cert, key = serving_pki(root)
    port = free_port()
    url = f"https://127.0.0.1:{port}"
    process = Process(
        "gpushare-webhook-dra",
        [
            str(Path(sys.executable).parent / "gpushare"),
            "webhook",
            "--host=127.0.0.1",
            f"--port={port}",
            f"--tls-cert-file={cert}",
            f"--tls-private-key-file={key}",
            "--no-steer",
            "--dra",
            f"--dra-memory-unit={unit}",
            *(() if gate else ("--dra-no-gate",)),
            f"--kubeconfig={kubeconfig}",
        ],
        cluster.root / "logs" / "webhook-dra.log",
    )
    process.start()
    (mutating,) = [d for d in config_docs if d["kind"] == "MutatingWebhookConfiguration"]
    bundle = base64.b64encode(ca.read_bytes()).decode()
    for hook in mutating["webhooks"]:
        path = hook["clientConfig"]["service"]["path"]
        hook["clientConfig"] = {"url": f"{url}{path}", "caBundle": bundle}
    applied = [*policy_docs, mutating, *claims_docs]
    try:
        _apply(cluster, *claims_docs, *policy_docs, mutating)
        context = ssl.create_default_context(cafile=str(ca))

        def healthy() -> bool:
            with urllib.request.urlopen(f"{url}/healthz", context=context, timeout=2) as answer:
                return bool(answer.status == 200)

        wait_for("gpushare webhook --dra /healthz", healthy, 30, process)
        probe = json.dumps(probe_pod(probe_namespace))

        def active() -> bool:
            result = cluster.kubectl(
                "create", "--dry-run=server", "-o", "json", "-f", "-", input=probe, check=False
            )
            return result.returncode == 0 and "resourceClaims" in result.stdout

        wait_for("the DRA webhook to take effect", active, 60, process)
        yield DraWebhook(process, url, applied)
    finally:
        for d in applied:
            cluster.kubectl("delete", d["kind"], d["metadata"]["name"], "--wait=false", check=False)
        process.stop()
        print(f"[e2e] webhook log tail:\n{process.tail(15)}", flush=True)


# -- the DRA driver on a real node -----------------------------------------------------------


def registered_times(node: RealNode) -> int:
    """How often kubelet has registered the driver (its log's ``phase=registered`` lines)."""
    log = node.cluster.root / "logs" / "gpushare-dra-driver.log"
    return log.read_text().count("phase=registered") if log.exists() else 0


def start_driver(node: RealNode) -> None:
    """Start (or restart) the driver and wait until kubelet has registered it."""
    before = registered_times(node)
    process = node.start_dra_driver()
    wait_for(
        "kubelet registers the DRA driver",
        lambda: registered_times(node) > before,
        60,
        process,
    )


def slice_devices(cluster: Cluster, node: str) -> dict[str, dict[str, Any]]:
    """The devices of the node's ResourceSlices, by name."""
    items = cluster.kubectl_json("get", "resourceslices", f"--field-selector=spec.nodeName={node}")[
        "items"
    ]
    return {d["name"]: d for s in items for d in s["spec"].get("devices") or []}


def set_dra_mode(node: RealNode, mode: str, *, fake_gpus: str | None = None) -> None:
    """Relabel the DRA node ``share`` or ``core_mem`` (and give it ``fake_gpus``), restart the
    driver, and wait until its slice publishes every GPU in that mode (no pods may hold GPUs)."""
    cluster = node.cluster
    if fake_gpus is not None:
        node.fake_gpus = fake_gpus
    node.mode = mode
    cluster.kubectl("label", "node", node.name, f"ack.node.gpu.schedule={mode}", "--overwrite")
    process = node.processes.get("gpushare-dra-driver")
    if process is not None and process.alive():
        node.kill("gpushare-dra-driver")
    start_driver(node)
    want = {f"gpu-{g.index}" for g in node.fake_gpus_list()}

    def published() -> bool:
        found = slice_devices(cluster, node.name)
        modes = {
            d.get("attributes", {}).get("mode", {}).get("string", mode) for d in found.values()
        }
        return set(found) == want and modes == {mode}

    wait_for(f"the slice of {node.name}: {sorted(want)} in {mode}", published, 60)


# -- claims, watched ------------------------------------------------------------------------


def _bytes(raw: Any) -> Fraction:
    parsed = parse_quantity(raw)
    if isinstance(parsed, str):
        raise AssertionError(f"consumedCapacity {raw!r}: {parsed}")
    return parsed.value


@dataclass
class ClaimWatch:
    """``kubectl get resourceclaims --watch`` on one namespace, in a thread.

    ``allocations``: each claim's allocation results, by claim name, as first seen allocated
    (kept after the claim is gone); ``reserved``: the same by the UID of the pod the claim was
    reserved for. A pod is compared with the claim reserved for it, not with the one its status
    names when it is read: kube-controller-manager v1.36.3 sometimes makes a second claim for a
    pod that just finished (its cache still showing the first one missing), names that one in
    the pod's status and then deletes it as unused ("delete unused generated claim" in its
    log), so a finished pod's status can name a claim that never ran anything. ``over``: every
    moment a device held more memory, summed over the claims allocated on it then, than
    ``capacity`` (bytes by ``pool/device``) says it has. ``peak``: the most memory each device
    held at once.
    """

    cluster: Cluster
    namespace: str
    capacity: dict[str, Fraction]
    allocations: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    reserved: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    over: list[str] = field(default_factory=list)
    peak: dict[str, Fraction] = field(default_factory=dict)
    events: int = 0
    _live: dict[str, list[tuple[str, Fraction]]] = field(default_factory=dict)
    _popen: subprocess.Popen[str] | None = None
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        kubectl = str(self.cluster.binaries["kubectl"])
        self._popen = subprocess.Popen(
            [kubectl, "get", "resourceclaims", "-n", self.namespace, "--watch", *WATCH_JSON],
            env=self.cluster.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def alive(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def stop(self) -> None:
        if self._popen is not None and self._popen.poll() is None:
            self._popen.terminate()
            self._popen.wait(timeout=10)
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._popen is not None and self._popen.stdout is not None:
            self._popen.stdout.close()

    def _read(self) -> None:
        assert self._popen is not None and self._popen.stdout is not None
        decoder = json.JSONDecoder()
        buffer = ""
        for line in self._popen.stdout:
            buffer += line
            while buffer.strip():
                try:
                    event, end = decoder.raw_decode(buffer.lstrip())
                except json.JSONDecodeError:
                    break
                buffer = buffer.lstrip()[end:]
                with self._lock:
                    self._event(event.get("type", ""), event.get("object") or {})

    def _event(self, kind: str, claim: dict[str, Any]) -> None:
        self.events += 1
        name = claim.get("metadata", {}).get("name", "")
        uid = claim.get("metadata", {}).get("uid", name)
        allocation = (claim.get("status") or {}).get("allocation")
        results = (allocation or {}).get("devices", {}).get("results") or []
        if kind == "DELETED" or not allocation:
            self._live.pop(uid, None)
            return
        self.allocations.setdefault(name, results)
        for entry in (claim.get("status") or {}).get("reservedFor") or []:
            if entry.get("resource") == "pods" and entry.get("uid"):
                self.reserved.setdefault(str(entry["uid"]), results)
        self._live[uid] = [
            (f"{r['pool']}/{r['device']}", _bytes((r.get("consumedCapacity") or {})["memory"]))
            for r in results
        ]
        held: dict[str, Fraction] = {}
        for shares in self._live.values():
            for device, memory in shares:
                held[device] = held.get(device, Fraction(0)) + memory
        for device, memory in held.items():
            self.peak[device] = max(self.peak.get(device, Fraction(0)), memory)
            if memory > self.capacity.get(device, Fraction(0)):
                self.over.append(
                    f"{device} holds {memory / 2**20} MiB of "
                    f"{self.capacity.get(device, 0) / 2**20} MiB after claim {name}"
                )

    def results(self, claim: str) -> list[dict[str, Any]] | None:
        with self._lock:
            return self.allocations.get(claim)

    def results_for(self, pod_uid: str) -> list[dict[str, Any]] | None:
        """The results of the claim reserved for the pod (see the class docstring)."""
        with self._lock:
            return self.reserved.get(pod_uid)


def capacities(cluster: Cluster, node: str) -> dict[str, Fraction]:
    """Each device's memory in bytes, by ``pool/device``, from the node's slice."""
    return {
        f"{node}/{name}": _bytes(d["capacity"]["memory"]["value"])
        for name, d in slice_devices(cluster, node).items()
    }


def claim_name(item: dict[str, Any]) -> str | None:
    """The name of the ResourceClaim kube-controller-manager made for the pod's ``gpushare``."""
    for entry in (item.get("status") or {}).get("resourceClaimStatuses") or []:
        if entry.get("name") == CLAIM and entry.get("resourceClaimName"):
            return str(entry["resourceClaimName"])
    return None


def container_requests(item: dict[str, Any], name: str) -> list[str]:
    """The requests of the pod's claim a container uses (``resources.claims``)."""
    spec = item["spec"]
    for c in [*(spec.get("initContainers") or []), *spec["containers"]]:
        if c["name"] == name:
            claims = (c.get("resources") or {}).get("claims") or []
            return [str(r.get("request", "")) for r in claims if r.get("name") == CLAIM]
    return []


def claim_shares(
    item: dict[str, Any], name: str, watch: ClaimWatch, unit_bytes: int
) -> tuple[list[tuple[int, int, int]], int] | str:
    """(the container's ``(index, memory units, percent)`` per GPU in its claim's results
    order, the claim's memory units); or why there is nothing to compare with."""
    claim = claim_name(item)
    if claim is None:
        return "the pod names no ResourceClaim"
    results = watch.results_for(str(item["metadata"].get("uid", ""))) or watch.results(claim)
    if results is None:
        return f"claim {claim} was never seen allocated, nor any claim reserved for the pod"
    requests = set(container_requests(item, name))

    def share(r: dict[str, Any]) -> tuple[int, int, int]:
        consumed = r.get("consumedCapacity") or {}
        units = _bytes(consumed["memory"]) / unit_bytes
        core = int(_bytes(consumed.get("cores", 0)))
        return int(r["device"].removeprefix("gpu-")), int(units), core

    mine = [share(r) for r in results if r.get("request") in requests]
    return mine, sum(share(r)[1] for r in results)
