"""Staged scheduling throughput: every pod exists before kube-scheduler starts.

Timing pods from their creation measures ``kubectl create`` as much as the scheduler: both
runs wait on the API server writing thousands of pods while kube-scheduler places them as
they come. Here kube-scheduler is stopped, all pods of a stage are created, and only then is
it started; the rate is counted from the first bind to the last, as a watch sees them
(``kubectl get pods --watch``, each line stamped as it arrives). The same method serves the
plain pods of the default profile and the GPU pods of the ``ack-co-scheduler`` profile, so
their ratio compares the two schedulers and nothing else.

Beside the rate a stage records:

- the CPU seconds each control-plane process spent from the first bind to the last
  (``/proc/<pid>/stat``), as a share of that wall time: on two cores the processes compete,
  and the extender's share is what its routes cost;
- kube-scheduler's ``scheduler_schedule_attempts_total`` by result: attempts beyond one per
  pod are retries (``error`` is a failed bind, ``unschedulable`` a failed filter);
- for the GPU stage, the extender's own counters and latency histograms taken before and
  after, so the stage's binds by outcome and its per-route percentiles are its own.

Used by ``benchmarks/throughput.py`` and the e2e scale test.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import ssl
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import msgspec
from prometheus_client.parser import text_string_to_metric_families

from harness.cluster import Cluster
from harness.helpers import gpu_pod_manifest
from harness.seeding import labelled_kwok_nodes

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PROCESSES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "gpushare-extender",
    "kwok",
)
ROUTES = ("filter", "prioritize", "bind")


def _object_path(manifest: dict[str, Any]) -> str:
    """The collection a manifest is POSTed to: nodes and namespaces are cluster-wide."""
    kind = manifest["kind"]
    if kind in ("Node", "Namespace"):
        return f"/api/v1/{kind.lower()}s"
    namespace = manifest["metadata"].get("namespace", "default")
    return f"/api/v1/namespaces/{namespace}/{kind.lower()}s"


def create_in_parallel(
    cluster: Cluster,
    manifests: list[dict[str, Any]],
    workers: int = 8,
    *,
    timeout: float = 3600,
    progress: Callable[[str], None] | None = None,
) -> None:
    """Create the manifests (core v1 objects) with ``workers`` concurrent API connections.

    One ``kubectl create`` of a List of thousands of objects posts them one at a time and gave
    up at its timeout for 20,000 pods on two busy cores; here each worker keeps one
    connection open and posts its share, an object that already exists counts as created (a
    retried POST may have landed), and a refused or failed POST is tried again with a short
    backoff until ``timeout``. ``progress`` hears the count every 10 seconds.
    """
    if not manifests:
        return
    pki = cluster.pki
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    port = cluster.ports["apiserver"]
    deadline = time.monotonic() + timeout
    done = [0]
    lock = threading.Lock()
    headers = {"Content-Type": "application/json", "Accept": "application/json"}

    def connect() -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=120)

    def create(chunk: list[dict[str, Any]]) -> None:
        connection = connect()
        try:
            for manifest in chunk:
                body = json.dumps(manifest).encode()
                path = _object_path(manifest)
                pause = 0.2
                while True:
                    try:
                        connection.request("POST", path, body=body, headers=headers)
                        response = connection.getresponse()
                        answer = response.read()
                        if response.status in (200, 201, 202, 409):
                            break
                        problem = f"{response.status} {answer[:300]!r}"
                        if response.status not in (429, 500, 503, 504):
                            raise RuntimeError(f"POST {path} answered {problem}")
                    except (OSError, http.client.HTTPException) as err:
                        problem = repr(err)
                        connection.close()
                        connection = connect()
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"POST {path} still failing at the deadline: {problem}")
                    time.sleep(pause)
                    pause = min(pause * 2, 5.0)
                with lock:
                    done[0] += 1
        finally:
            connection.close()

    chunks = [manifests[i::workers] for i in range(workers) if manifests[i::workers]]
    with ThreadPoolExecutor(len(chunks)) as pool:
        futures = [pool.submit(create, chunk) for chunk in chunks]
        shown = time.monotonic()
        while not all(f.done() for f in futures):
            if any(f.done() and f.exception() is not None for f in futures):
                break
            time.sleep(0.2)
            if progress is not None and time.monotonic() - shown >= 10:
                shown = time.monotonic()
                progress(f"created {done[0]}/{len(manifests)}")
        for future in futures:
            future.result()


def gpu_nodes(
    cluster: Cluster,
    names: list[str],
    label: str,
    timeout: float = 900,
    progress: Callable[[str], None] | None = None,
) -> None:
    """Create kwok nodes of 8 x 15 GiB GPUs (cgpu) labelled ``gpushare-e2e=<label>`` and wait
    until all are Ready."""
    manifests = labelled_kwok_nodes(names, label, gpus_units=[15] * 8, mode="cgpu")
    create_in_parallel(cluster, manifests, timeout=timeout, progress=progress)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = cluster.kubectl(
            "get", "nodes", "-l", f"gpushare-e2e={label}", "--no-headers", timeout=300
        ).stdout
        ready = text.count(" Ready ")
        if ready >= len(names):
            return
        if progress is not None:
            progress(f"{ready}/{len(names)} nodes Ready")
        time.sleep(5)
    raise RuntimeError(f"{len(names)} kwok nodes did not become Ready")


SIZES = [1, 1, 2, 2, 3, 4, 4, 6, 8, 12]
"""GiB per GPU pod of a stage, drawn uniformly."""


def stage_pods(
    count: int, seed: int, selector: dict[str, str], *, gpu_namespace: str, plain_namespace: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The plain pods (default profile) and the GPU pods (``ack-co-scheduler``, 1-12 GiB
    from ``SIZES``) of a staged run, all asking for 100m CPU."""
    rng = random.Random(seed)
    plain = []
    gpu = []
    for i in range(count):
        pod = gpu_pod_manifest(f"g{i:05d}", gpu_namespace, rng.choice(SIZES), selector=selector)
        pod["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "100m"}
        gpu.append(pod)
        pod = gpu_pod_manifest(f"c{i:05d}", plain_namespace, 1, selector=selector)
        pod["spec"]["schedulerName"] = "default-scheduler"
        pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "100m"}}
        plain.append(pod)
    return plain, gpu


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process and its waited-for children."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # after the command: state is field 3; utime, stime, cutime, cstime are fields 14-17
    return sum(int(v) for v in fields[11:15]) / CLOCK_TICKS


def run_delay_seconds(pid: int) -> float:
    """Seconds the threads of a process have waited on a run queue for a CPU, summed.

    The kernel's ``/proc/PID/task/TID/schedstat`` (its second field, in nanoseconds): time a
    thread was ready to run and did not. The extender runs one event loop, so its figure is
    how long that loop waited for a core; a Go process's figure adds its threads' waits.
    """
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as handle:
                total += int(handle.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended, or a kernel without schedstats
    return total / 1e9


def _per_process(cluster: Cluster, read: Callable[[int], float]) -> dict[str, float]:
    """``read`` of each control-plane process that runs, by name."""
    return {
        name: read(cluster.processes[name].pid)
        for name in PROCESSES
        if name in cluster.processes and cluster.processes[name].alive()
    }


def wait_snapshot(cluster: Cluster) -> dict[str, float]:
    """Run-queue wait so far, in seconds, of each control-plane process that runs."""
    return _per_process(cluster, run_delay_seconds)


def cpu_snapshot(cluster: Cluster) -> dict[str, float]:
    """CPU seconds so far of each control-plane process that runs."""
    return _per_process(cluster, cpu_seconds)


Samples = Mapping[tuple[str, tuple[tuple[str, str], ...]], float]


SCRAPE_TRIES = 4
SCRAPE_TIMEOUT_S = 60.0


def scrape(url: str, context: ssl.SSLContext | None = None) -> Samples:
    """A Prometheus text page as ``{(sample name, sorted labels): value}``.

    Tried ``SCRAPE_TRIES`` times: on two cores shared with a control plane taking in tens of
    thousands of new pods, a process can go a minute without the CPU to answer, and an hour's
    run must not be lost to one late page (the wait is said on stderr).
    """
    for attempt in range(1, SCRAPE_TRIES + 1):
        try:
            with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S, context=context) as response:
                text = response.read().decode()
            break
        except (TimeoutError, OSError) as err:
            if attempt == SCRAPE_TRIES:
                raise
            print(f"{url} did not answer ({err}); trying again", file=sys.stderr, flush=True)
            time.sleep(5.0)
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def counter(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name`` over samples whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


def quantile(before: Samples, after: Samples, name: str, q: float, **labels: str) -> float | None:
    """``histogram_quantile`` over the observations made between two scrapes, in seconds.

    Linear inside the bucket the quantile falls in, as Prometheus does; None without
    observations.
    """
    bounds: list[tuple[float, float]] = []
    for (sample, ls), value in after.items():
        label = dict(ls)
        if sample != f"{name}_bucket" or any(label.get(k) != v for k, v in labels.items()):
            continue
        edge = float(label["le"])
        bounds.append((edge, value - before.get((sample, ls), 0.0)))
    bounds.sort()
    if not bounds or bounds[-1][1] <= 0:
        return None
    rank = q * bounds[-1][1]
    low_edge, low_count = 0.0, 0.0
    for edge, count in bounds:
        if count >= rank:
            if edge == float("inf"):
                return low_edge
            span = count - low_count
            return low_edge + (edge - low_edge) * ((rank - low_count) / span if span else 1.0)
        low_edge, low_count = edge, count
    return low_edge


def means_ms(samples: Samples, name: str, by: str = "", **labels: str) -> dict[str, float]:
    """A histogram's mean (``_sum`` over ``_count``) per value of the label ``by`` (all under
    ``""`` without one), in ms, over the samples whose labels include ``labels``."""
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for (sample, ls), value in samples.items():
        label = dict(ls)
        if any(label.get(k) != v for k, v in labels.items()) or (by and by not in label):
            continue
        key = label[by] if by else ""
        if sample == f"{name}_sum":
            sums[key] = sums.get(key, 0.0) + value
        elif sample == f"{name}_count":
            counts[key] = counts.get(key, 0.0) + value
    return {k: round(1000 * sums.get(k, 0.0) / n, 3) for k, n in counts.items() if n}


class _Meta(msgspec.Struct):
    name: str = ""
    resourceVersion: str = ""


class _Spec(msgspec.Struct):
    nodeName: str = ""


class _Pod(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)
    spec: _Spec = msgspec.field(default_factory=_Spec)


class _Event(msgspec.Struct):
    type: str
    object: _Pod


class _List(msgspec.Struct):
    metadata: _Meta
    items: list[_Pod]


class BindWatch:
    """A watch on one namespace's pods, stamping each pod's first bind as it arrives.

    It reads the API itself (a list, then a watch from the list's resourceVersion, again from
    the last one seen whenever the server ends it) and decodes only name, resourceVersion and
    nodeName. ``kubectl get --watch`` was tried first: it ends without a word when its watch
    is closed, and stamps nothing after that.
    """

    def __init__(self, cluster: Cluster, namespace: str, expected: int) -> None:
        self.expected = expected
        self.bound: dict[str, float] = {}
        self.listed = threading.Event()
        self.done = threading.Event()
        self.cpu_at_first: dict[str, float] = {}
        self.wait_at_first: dict[str, float] = {}
        self._cluster = cluster
        self._path = f"/api/v1/namespaces/{namespace}/pods"
        self._closed = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _connection(self) -> http.client.HTTPSConnection:
        pki = self._cluster.pki
        context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        port = self._cluster.ports["apiserver"]
        return http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=600)

    def _see(self, pod: _Pod, now: float) -> None:
        if pod.spec.nodeName and pod.metadata.name not in self.bound:
            if not self.bound:
                self.cpu_at_first = cpu_snapshot(self._cluster)
                self.wait_at_first = wait_snapshot(self._cluster)
            self.bound[pod.metadata.name] = now
            if len(self.bound) >= self.expected:
                self.done.set()

    def _run(self) -> None:
        try:
            connection = self._connection()
            connection.request("GET", self._path)
            listed = msgspec.json.decode(connection.getresponse().read(), type=_List)
            connection.close()
            version = listed.metadata.resourceVersion
            for pod in listed.items:
                self._see(pod, time.monotonic())
            if len(listed.items) >= self.expected:
                self.listed.set()
            events = msgspec.json.Decoder(_Event)
            while not self._closed.is_set() and not self.done.is_set():
                connection = self._connection()
                connection.request(
                    "GET", f"{self._path}?watch=1&resourceVersion={version}&allowWatchBookmarks=1"
                )
                response = connection.getresponse()
                for line in response:
                    now = time.monotonic()
                    event = events.decode(line)
                    if event.type == "ERROR":
                        raise RuntimeError(f"watch answered {line.decode(errors='replace')}")
                    version = event.object.metadata.resourceVersion or version
                    if event.type in ("ADDED", "MODIFIED"):
                        self._see(event.object, now)
                    if self._closed.is_set() or self.done.is_set():
                        break
                connection.close()
        except BaseException as err:  # the waiting thread reports it
            self._error = err
            self.done.set()
            self.listed.set()

    def check(self) -> None:
        """Raise what ended the watch early, if anything did."""
        if self._error is not None:
            raise RuntimeError(f"the bind watch failed: {self._error!r}") from self._error

    def close(self) -> None:
        self._closed.set()


@dataclass(frozen=True)
class Stage:
    """What one staged run measured."""

    name: str
    pods: int
    bound: int
    seconds: float
    """From the first bind to the last."""
    cpu_share: dict[str, float] = field(default_factory=dict)
    """Each process's CPU seconds over ``seconds``, as a fraction of one core."""
    run_wait_ms: dict[str, float] = field(default_factory=dict)
    """Each process's run-queue wait per pod bound, in milliseconds (``run_delay_seconds``):
    how long it was ready to run and found no free core."""
    attempts: dict[str, float] = field(default_factory=dict)
    """kube-scheduler's schedule attempts of this stage by result."""
    binds: dict[str, float] = field(default_factory=dict)
    """The extender's bind attempts of this stage by outcome (GPU stages)."""
    routes_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    """The extender's p50 and p99 per route, in milliseconds (GPU stages)."""
    scheduler_ms: dict[str, float] = field(default_factory=dict)
    """kube-scheduler's mean time per scheduling attempt, in milliseconds: the whole attempt,
    its algorithm (filter and score, the extender's calls included) and each extension point
    of the framework's own plugins. The algorithm less PreFilter, Filter, PreScore and Score
    is what the extender's filter and prioritize calls cost it, round trip included."""

    @property
    def pods_per_second(self) -> float:
        """Binds per second between the first and the last."""
        return (self.bound - 1) / self.seconds if self.seconds > 0 and self.bound > 1 else 0.0

    @property
    def retries(self) -> float:
        """Schedule attempts beyond one per pod."""
        return sum(self.attempts.values()) - self.bound

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "pods": self.pods,
            "bound": self.bound,
            "seconds": round(self.seconds, 2),
            "pods_per_second": round(self.pods_per_second, 1),
            "retries": self.retries,
            "attempts": self.attempts,
            "binds": self.binds,
            "routes_ms": self.routes_ms,
            "scheduler_ms": self.scheduler_ms,
            "cpu_share": {k: round(v, 3) for k, v in self.cpu_share.items()},
            "run_wait_ms": {k: round(v, 2) for k, v in self.run_wait_ms.items()},
        }


def _scheduler_context(cluster: Cluster) -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.load_cert_chain(str(cluster.pki / "admin.crt"), str(cluster.pki / "admin.key"))
    return context


def run_stage(
    cluster: Cluster,
    name: str,
    namespace: str,
    manifests: Sequence[dict[str, Any]],
    *,
    gpu: bool,
    timeout: float = 900,
    progress: Any = print,
    on_start: Callable[[], None] | None = None,
) -> Stage:
    """Create every pod with kube-scheduler stopped, start it, time first to last bind
    (``on_start`` is called just before kube-scheduler starts)."""
    cluster.stop_scheduler()
    cluster.create_namespace(namespace)
    progress(f"[{name}] creating {len(manifests)} pods with kube-scheduler stopped")
    create_in_parallel(cluster, list(manifests), progress=progress)
    watch = BindWatch(cluster, namespace, len(manifests))
    try:
        listed = watch.listed.wait(120)
        watch.check()
        if not listed:
            raise RuntimeError(f"[{name}] the watch did not list {len(manifests)} pods")
        extender_url = f"{cluster.extender_url}/metrics"
        before = scrape(extender_url) if gpu else {}
        progress(f"[{name}] starting kube-scheduler")
        if on_start is not None:
            on_start()
        cluster.start_scheduler()
        deadline = time.monotonic() + timeout
        shown = time.monotonic()
        while not watch.done.wait(1):
            if time.monotonic() > deadline:
                break
            if time.monotonic() - shown >= 10:
                shown = time.monotonic()
                progress(f"[{name}] {len(watch.bound)}/{len(manifests)} bound")
        watch.check()
        cpu_end = cpu_snapshot(cluster)
        wait_end = wait_snapshot(cluster)
        after = scrape(extender_url) if gpu else {}
        port = cluster.ports["scheduler"]
        sched = scrape(f"https://127.0.0.1:{port}/metrics", _scheduler_context(cluster))
    finally:
        watch.close()
    times = sorted(watch.bound.values())
    seconds = times[-1] - times[0] if len(times) > 1 else 0.0
    cpu_share = {
        proc: (cpu_end[proc] - watch.cpu_at_first.get(proc, cpu_end[proc])) / seconds
        for proc in cpu_end
        if seconds > 0
    }
    run_wait_ms = {
        proc: (wait_end[proc] - watch.wait_at_first.get(proc, wait_end[proc])) * 1000 / len(times)
        for proc in wait_end
        if times
    }
    attempts = {
        dict(ls)["result"]: v
        for (n, ls), v in sched.items()
        if n == "scheduler_schedule_attempts_total" and v
    }
    binds: dict[str, float] = {}
    routes: dict[str, dict[str, float]] = {}
    if gpu:
        for (n, ls), v in after.items():
            if n == "gpushare_bind_total":
                outcome = dict(ls)["outcome"]
                delta = v - before.get((n, ls), 0.0)
                if delta:
                    binds[outcome] = delta
        for route in ROUTES:
            figures = {}
            for label, q in (("p50", 0.5), ("p99", 0.99)):
                value = quantile(
                    before, after, "gpushare_extender_request_duration_seconds", q, verb=route
                )
                if value is not None:
                    figures[label] = round(value * 1000, 2)
            routes[route] = figures
    profile = "ack-co-scheduler" if gpu else "default-scheduler"
    timing = {
        "attempt": means_ms(
            sched, "scheduler_scheduling_attempt_duration_seconds", "profile", result="scheduled"
        ).get(profile, 0.0),
        "algorithm": means_ms(sched, "scheduler_scheduling_algorithm_duration_seconds").get(
            "", 0.0
        ),
        **means_ms(
            sched,
            "scheduler_framework_extension_point_duration_seconds",
            "extension_point",
            profile=profile,
            status="Success",
        ),
    }
    return Stage(
        name=name,
        pods=len(manifests),
        bound=len(watch.bound),
        seconds=seconds,
        cpu_share=cpu_share,
        run_wait_ms=run_wait_ms,
        attempts=attempts,
        binds=binds,
        routes_ms=routes,
        scheduler_ms=timing,
    )
