"""The seed walkthrough, the cuda-sample and the randomized stress on a real node in DRA mode.

One real node (kubelet and containerd 2, kube-scheduler and kube-controller-manager v1.36.3),
labelled ``gpushare.io/allocation-mode=dra``, no device plugin: ``gpushare dra-driver`` runs
beside kubelet with the chart's identity (as in ``test_real_dra_driver.py``), and
``gpushare webhook --dra`` (``tests.support.dra``) turns the ACK resources of the pods of the
test namespace, labelled for DRA mode, into claims behind the gate ``gpushare.io/dra-allocation``;
``gpushare extender --dra-allocator``, with the chart's identity and RBAC
(``dra.allocator.enabled``), places them and lifts the gate.

The manifests are the seed documents' (``examples/``), as the device-plugin tests run them
(``test_real_node.py``, ``test_real_stress.py``): the image is the local test image and each
container runs ``/probe``, which prints the environment and device nodes it was handed. Every
container is compared with its claim's allocation (the GPU and ``consumedCapacity`` of each
result of its requests), with the same expectation as device-plugin mode's
(``tests.support.realnode.handed``); the claims are watched, so a claim deallocated as soon as
its pod finished is still known, and so no GPU may ever hold more memory than it has.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Iterator
from typing import Any

import pytest

from harness.cluster import Cluster
from harness.identities import EXTENDER_VALUES, IDENTITY_TEMPLATES, chart_documents
from harness.realnode import NODE_NAME, RealNode, probe_env
from tests.support.dra import (
    MODE_LABEL,
    ClaimWatch,
    capacities,
    claim_name,
    claim_shares,
    dra_webhook,
    set_dra_mode,
    slice_devices,
)
from tests.support.e2e import eventually, hold_real_node
from tests.support.realnode import (
    NS,
    PROBE_THEN,
    Want,
    compare,
    fresh_namespace,
    handed,
    local_job,
    logged,
    ns_pods,
    reasons,
    run_cuda_sample,
    run_stress,
)

TOTAL = int(os.environ.get("GPUSHARE_STRESS_PODS", "500"))
GIB = 2**30


@pytest.fixture(scope="module")
def dra_node(cluster: Cluster) -> Iterator[RealNode]:
    """The real node in DRA mode, the webhook converting the test namespace's pods, and the
    allocator placing them; the seed's one 15 GiB GPU to start with."""
    started = time.monotonic()
    for node in hold_real_node(cluster, plugin=False, fake_gpus="1x15GiB"):
        cluster.kubectl("label", "node", NODE_NAME, f"{MODE_LABEL}=dra", "--overwrite")
        fresh_namespace(cluster)
        cluster.kubectl("label", "namespace", NS, f"{MODE_LABEL}=dra", "--overwrite")
        values = (*EXTENDER_VALUES, "--set", "dra.allocator.enabled=true")
        identities = chart_documents(cluster, IDENTITY_TEMPLATES, values=values)
        cluster.kubectl("apply", "-f", "-", input=json.dumps(_list(identities)))
        root = cluster.root / "dra-real-webhook"
        root.mkdir(exist_ok=True)
        try:
            cluster.start_extender(extra=["--dra-allocator"])
            with dra_webhook(cluster, root, probe_namespace=NS):
                set_dra_mode(node, "share")
                print(
                    f"[dra] node, driver, webhook and allocator up in "
                    f"{time.monotonic() - started:.1f}s",
                    flush=True,
                )
                yield node
        finally:
            # the node is torn down next (its pods deleted, kubelet stopped): the namespace
            # need not be waited for here
            cluster.kubectl("delete", "namespace", NS, "--wait=false", check=False)
            cluster.start_extender(extra=())


def _list(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "List", "items": items}


def uuids_of(node: RealNode) -> dict[int, str]:
    return {g.index: g.uuid for g in node.fake_gpus_list()}


def watch_claims(node: RealNode) -> ClaimWatch:
    watch = ClaimWatch(node.cluster, NS, capacities(node.cluster, node.name))
    watch.start()
    return watch


def from_claim(node: RealNode, watch: ClaimWatch) -> Want:
    """What each container must see, from its claim's allocation (``compare``'s ``want``)."""
    uuids = uuids_of(node)

    def want(item: dict[str, Any], name: str) -> dict[str, str] | str:
        shares = claim_shares(item, name, watch, GIB)
        if isinstance(shares, str):
            return shares
        gpus, pod_mem = shares
        return handed(gpus, pod_mem, uuids, node.device_list_strategy)

    return want


def running_pod(cluster: Cluster, selector: str) -> dict[str, Any]:
    def running() -> dict[str, Any] | None:
        items = cluster.kubectl_json("get", "pods", "-n", NS, "-l", selector)["items"]
        ok = [p for p in items if p["status"].get("phase") == "Running"]
        failed = [reasons(p) for p in items if p["status"].get("phase") == "Failed"]
        assert not failed, failed
        return ok[0] if ok else None

    try:
        return eventually(running, 120, f"{selector} Running")  # type: ignore[no-any-return]
    except AssertionError:
        events = cluster.kubectl("get", "events", "-n", NS, check=False).stdout
        raise AssertionError(f"{selector} did not run:\n{events[-3000:]}") from None


def inspected(shown: str) -> tuple[str, str]:
    """(the node's GPU0 Allocated/Total, the cluster's line) of ``kubectl inspect cgpu``, as the
    seed's walkthrough reads them: ``3/15`` and ``3/15 (20%)`` with its Job running."""
    row = next((x.split() for x in shown.splitlines() if x.startswith(NODE_NAME)), [])
    return (row[2] if len(row) > 2 else "", shown.strip().splitlines()[-1])


def test_seed_walkthrough_in_dra_mode(dra_node: RealNode) -> None:
    """The seed's GPUtest Job as written (its image and command the probe's): converted into a
    claim of 3 GiB, allocated on the seed's 15 GiB GPU, Running with the seed's variables;
    ``kubectl inspect cgpu`` shows 0/15, then 3/15 (20%), then 0/15 again, as the seed says."""
    started = time.monotonic()
    cluster = dra_node.cluster
    watch = watch_claims(dra_node)
    try:
        before = cluster.kubectl("inspect", "cgpu").stdout
        print(before)
        assert inspected(before) == ("0/15", "0/15 (0%)"), before
        job = local_job("GPUtest.yaml", command=["/bin/sh", "-c", PROBE_THEN + "sleep 3600"])
        cluster.kubectl("apply", "-f", "-", input=json.dumps(job))
        pod = running_pod(cluster, "job-name=gpu-share-sample")
        name = pod["metadata"]["name"]
        spec = pod["spec"]
        assert spec["schedulerName"] == "ack-co-scheduler"
        (entry,) = spec["resourceClaims"]
        assert entry["name"] == "gpushare" and entry["resourceClaimTemplateName"], entry
        (main,) = spec["containers"]
        assert "aliyun.com/gpu-mem" not in (main["resources"].get("limits") or {})
        assert main["resources"]["claims"] == [{"name": "gpushare", "request": main["name"]}]
        claim = claim_name(pod)
        assert claim is not None
        allocated = cluster.kubectl_json("get", "resourceclaim", claim, "-n", NS)["status"]
        (result,) = allocated["allocation"]["devices"]["results"]
        assert (result["pool"], result["device"]) == (NODE_NAME, "gpu-0")
        assert result["consumedCapacity"]["memory"] == "3Gi"
        assert [r["name"] for r in allocated["reservedFor"]] == [name]

        logs = eventually(
            lambda: cluster.kubectl("logs", "-n", NS, name, check=False).stdout.strip(),
            30,
            "the probe's output",
        )
        print(logs)
        env = probe_env(logs)
        assert env["ALIYUN_COM_GPU_MEM_CONTAINER"] == "3"
        assert env["ALIYUN_COM_GPU_MEM_DEV"] == "15"
        assert env["ALIYUN_COM_GPU_MEM_IDX"] == "0"
        assert env["ALIYUN_COM_GPU_MEM_POD"] == "3"
        item = cluster.kubectl_json("get", "pod", name, "-n", NS)
        checked, mismatches, _ = compare(
            logged(cluster, [item]),
            uuids_of(dra_node),
            dra_node.device_list_strategy,
            from_claim(dra_node, watch),
        )
        print(f"[dra] walkthrough: {checked} container checked, {len(mismatches)} mismatches")
        assert checked == 1 and not mismatches, mismatches

        shown = cluster.kubectl("inspect", "cgpu").stdout
        print(shown)
        assert inspected(shown) == ("3/15", "3/15 (20%)"), shown

        cluster.kubectl("delete", "job", "gpu-share-sample", "-n", NS, "--wait=false")
        eventually(
            lambda: not list(dra_node.cdi_dir.glob("gpushare.io-claim-*.json")),
            60,
            "the claim unprepared (its CDI spec removed)",
        )
        released = eventually(
            lambda: (
                inspected(out := cluster.kubectl("inspect", "cgpu").stdout) == ("0/15", "0/15 (0%)")
                and out
            ),
            30,
            "the claim's 3 GiB released in kubectl inspect cgpu",
        )
        print(released)
        assert not watch.over, watch.over
        print(f"[dra] walkthrough in {time.monotonic() - started:.1f}s", flush=True)
    finally:
        watch.stop()
        cluster.kubectl("delete", "job", "gpu-share-sample", "-n", NS, "--ignore-not-found")


def test_cuda_sample_in_dra_mode_on_a_core_mem_node(dra_node: RealNode) -> None:
    """The cuda-sample Job as the device-plugin test runs it, on 4 x 15 GiB ``core_mem`` GPUs:
    30 % and 2 GiB of one, enforced by the interposer."""
    started = time.monotonic()
    cluster = dra_node.cluster
    eventually(lambda: not ns_pods(cluster), 60, "the walkthrough's pod gone")
    set_dra_mode(dra_node, "core_mem", fake_gpus="4x15GiB")
    devices = slice_devices(cluster, NODE_NAME)
    assert sorted(devices) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    for device in devices.values():  # the slice's 400 % and 60 GiB: 4 x (100 %, 15 GiB)
        assert device["capacity"]["cores"]["value"] == "100", device
        assert device["capacity"]["memory"]["value"] == "15Gi", device
    watch = watch_claims(dra_node)
    try:
        items, _ = run_cuda_sample(cluster)
        claim = claim_name(items[0])
        assert claim is not None
        (result,) = watch.results(claim) or [{}]
        assert result["consumedCapacity"] == {"memory": "2Gi", "cores": "30"}, result
        checked, mismatches, _ = compare(
            items, uuids_of(dra_node), dra_node.device_list_strategy, from_claim(dra_node, watch)
        )
        print(f"[dra] cuda-sample: {checked} container checked, {len(mismatches)} mismatches")
        assert checked == 1 and not mismatches, mismatches
        assert not watch.over, watch.over
        print(f"[dra] cuda-sample in {time.monotonic() - started:.1f}s", flush=True)
    finally:
        watch.stop()
        cluster.kubectl("delete", "job", "cuda-sample", "-n", NS, "--ignore-not-found")


def test_randomized_stress_in_dra_mode(
    dra_node: RealNode, capsys: pytest.CaptureFixture[str]
) -> None:
    """The device-plugin stress (``run_stress``: the same pods, seed and pace) on 8 x 32 GiB
    GPUs in DRA mode: every container compared with its claim, no GPU ever over its memory."""
    cluster = dra_node.cluster
    eventually(lambda: not ns_pods(cluster), 60, "the cuda-sample's pod gone")
    set_dra_mode(dra_node, "share", fake_gpus="8x32GiB")
    rng = random.Random(int(os.environ.get("GPUSHARE_STRESS_SEED", "13")))
    watch = watch_claims(dra_node)
    want = from_claim(dra_node, watch)
    uuids = uuids_of(dra_node)

    def check(items: list[dict[str, Any]]) -> tuple[int, list[str]]:
        checked, wrong, _ = compare(items, uuids, dra_node.device_list_strategy, want)
        return checked, wrong

    try:
        run = run_stress(cluster, rng, TOTAL, check, tag="dra-stress")
        watched = watch.alive()
        with capsys.disabled():
            print(f"\n{run.summary('dra-stress')}", flush=True)
            print(
                f"[dra-stress] {len(watch.allocations)} claims seen allocated in "
                f"{watch.events} watch events; {len(watch.over)} moments a GPU held more than "
                f"its memory; peak GiB per GPU: "
                + ", ".join(
                    f"{d.rsplit('/', 1)[-1]}={float(v / GIB):g}"
                    for d, v in sorted(watch.peak.items())
                ),
                flush=True,
            )
            for line in run.mismatches[:20] + run.pending[:20] + watch.over[:20]:
                print(f"[dra-stress]   {line}", flush=True)
        assert watched, "the claim watch ended early"
        assert run.created == TOTAL
        assert not run.mismatches, run.mismatches[:20]
        assert not run.pending, run.pending[:20]
        assert run.checked >= len(run.finished)
        assert not watch.over, watch.over[:20]
    finally:
        watch.stop()
