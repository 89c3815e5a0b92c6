"""Admission refuses what only gpushare writes: hand-off annotations, isolation env, nodeName.

Each test starts from what a tenant who can create pods in their own namespace sent, and checks
the refusal names the field path, the value, the rule and what to do. The trusted identities
(the extender's and the device plugin's ServiceAccounts) keep writing what they write.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpushare.core.admitting.admission import AdmissionSettings
from tests.support.tampering import MEM, TENANT, answer, gpu_pod, refused, review

CORE = "aliyun.com/gpu-core.percentage"
EXTENDER = "system:serviceaccount:gpushare:gpushare-scheduler"
PLUGIN = "system:serviceaccount:gpushare:gpushare-device-plugin"
ALLOCATION = (
    '{"v":1,"unit":"1GiB","node":"gpu-node-1","containers":[{"name":"main","gpus":[[0,15]]}]}'
)


def trusting(*users: str, groups: tuple[str, ...] = ()) -> AdmissionSettings:
    from gpushare.core.admitting.tampering import TrustedWriters

    return AdmissionSettings(trust=TrustedWriters(users=frozenset(users), groups=frozenset(groups)))


def bound(**kwargs: Any) -> dict[str, Any]:
    """A pod as the extender leaves it after bind: placed, annotated, not yet served."""
    pod = gpu_pod(node="gpu-node-1", **kwargs)
    pod["metadata"]["annotations"] = {
        "gpushare.io/allocation": ALLOCATION,
        "ALIYUN_COM_GPU_MEM_IDX": "0",
        "ALIYUN_COM_GPU_MEM_POD": "1",
        "ALIYUN_COM_GPU_MEM_DEV": "15",
        "ALIYUN_COM_GPU_MEM_ASSIGNED": "false",
        "ALIYUN_COM_GPU_MEM_ASSUME_TIME": "1700000000000000000",
    }
    return pod


# 1. A forged allocation on CREATE ---------------------------------------------------------------


def test_forged_allocation_on_create_is_refused() -> None:
    message = refused(review(gpu_pod(annotations={"gpushare.io/allocation": ALLOCATION})))
    assert "Pod team-a/p" in message
    assert 'metadata.annotations["gpushare.io/allocation"]=' in message
    assert '"gpus":[[0,15]]' in message  # the value
    assert "only gpushare's extender and device plugin write them" in message  # the rule
    assert "remove the annotation" in message  # what to do


def test_every_handoff_annotation_and_any_gpushare_io_key_is_refused_on_create() -> None:
    for key in (
        "ALIYUN_COM_GPU_MEM_IDX",
        "ALIYUN_COM_GPU_MEM_POD",
        "ALIYUN_COM_GPU_MEM_DEV",
        "ALIYUN_COM_GPU_MEM_ASSUME_TIME",
        "gpushare.io/seal",
        "gpushare.io/anything-later",
    ):
        message = refused(review(gpu_pod(annotations={key: "1"})))
        assert f"metadata.annotations[\"{key}\"]='1'" in message
    # also on a pod that asks for no GPU: the ledger reads annotations, not limits
    plain = gpu_pod(limits={"cpu": "1"}, annotations={"gpushare.io/allocation": ALLOCATION})
    refused(review(plain))
    # other domains are the user's own
    assert answer(review(gpu_pod(annotations={"example.com/gpushare.io": "x"})))["allowed"]


def test_forged_annotations_in_a_workload_template_are_refused() -> None:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j", "namespace": "team-a"},
        "spec": {"template": gpu_pod(annotations={"ALIYUN_COM_GPU_MEM_ASSIGNED": "true"})},
    }
    request = review(job)
    request["request"]["kind"] = {"group": "batch", "version": "v1", "kind": "Job"}
    message = refused(request)
    assert "spec.template.metadata.annotations[\"ALIYUN_COM_GPU_MEM_ASSIGNED\"]='true'" in message


# 2. ALIYUN_COM_GPU_MEM_ASSIGNED=true set by a tenant ------------------------------------------


def test_assigned_true_set_by_a_tenant_is_refused() -> None:
    message = refused(review(gpu_pod(annotations={"ALIYUN_COM_GPU_MEM_ASSIGNED": "true"})))
    assert "metadata.annotations[\"ALIYUN_COM_GPU_MEM_ASSIGNED\"]='true'" in message
    # the merge patch `{"metadata":{"annotations":{"ALIYUN_COM_GPU_MEM_ASSIGNED":"true"}}}`
    # reaches admission as an UPDATE of the whole pod: oldObject before, object after
    before = bound()
    after = copy.deepcopy(before)
    after["metadata"]["annotations"]["ALIYUN_COM_GPU_MEM_ASSIGNED"] = "true"
    message = refused(review(after, "UPDATE", before))
    assert (
        "metadata.annotations[\"ALIYUN_COM_GPU_MEM_ASSIGNED\"] changed from 'false' to 'true'"
        in message
    )
    assert f'by "{TENANT}"' in message
    assert "leave it as it was" in message


def test_the_device_plugin_marks_its_pod_served() -> None:
    before = bound()
    after = copy.deepcopy(before)
    after["metadata"]["annotations"]["ALIYUN_COM_GPU_MEM_ASSIGNED"] = "true"
    settings = trusting(EXTENDER, PLUGIN)
    assert answer(review(after, "UPDATE", before, user=PLUGIN), settings) == {
        "uid": "b5e2a1f0-0000-4000-8000-000000000001",
        "allowed": True,
    }
    # trust is per identity: the plugin's name in a group the tenant claims is not enough
    refused(review(after, "UPDATE", before, groups=(PLUGIN,)), settings)
    refused(review(after, "UPDATE", before), settings)


# 3. LD_PRELOAD, GPUSHARE_MEM_LIMIT and NVIDIA_VISIBLE_DEVICES in env --------------------------


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("LD_PRELOAD", "/tmp/nothing.so"),
        ("GPUSHARE_MEM_LIMIT", "0=80g"),
        ("GPUSHARE_CORE_LIMIT", "100"),
        ("NVIDIA_VISIBLE_DEVICES", "all"),
        ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=80G"),
        ("CUDA_MPS_PIPE_DIRECTORY", "/tmp"),
    ],
)
def test_isolation_env_on_a_gpu_pod_is_refused(name: str, value: str) -> None:
    message = refused(
        review(gpu_pod(env=[{"name": "OK", "value": "1"}, {"name": name, "value": value}]))
    )
    assert f"container \"main\" (spec.containers[0].env[1]): {name}='{value}'" in message
    assert "remove it" in message
    # an init container is a container too
    pod = gpu_pod()
    pod["spec"]["initContainers"] = [
        {"name": "setup", "image": "x", "env": [{"name": name, "value": value}]}
    ]
    assert 'container "setup" (spec.initContainers[0].env[0])' in refused(review(pod))


def test_the_hostile_pod_is_refused_with_every_reason() -> None:
    hostile = gpu_pod(
        node="gpu-node-1",
        annotations={"gpushare.io/allocation": ALLOCATION, "ALIYUN_COM_GPU_MEM_ASSIGNED": "true"},
        env=[
            {"name": "LD_PRELOAD", "value": "/tmp/nothing.so"},
            {"name": "GPUSHARE_MEM_LIMIT", "value": "0=80g"},
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
        ],
    )
    message = refused(review(hostile))
    for needle in (
        'metadata.annotations["gpushare.io/allocation"]',
        'metadata.annotations["ALIYUN_COM_GPU_MEM_ASSIGNED"]',
        "spec.nodeName='gpu-node-1'",
        "LD_PRELOAD='/tmp/nothing.so'",
        "GPUSHARE_MEM_LIMIT='0=80g'",
        "NVIDIA_VISIBLE_DEVICES='all'",
    ):
        assert needle in message


def test_nvidia_visible_devices_is_refused_on_pods_without_gpu_resources_too() -> None:
    plain = gpu_pod(limits={"cpu": "1"}, env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])
    message = refused(review(plain))
    assert "NVIDIA_VISIBLE_DEVICES='all' is refused on every pod" in message
    from_secret = gpu_pod(
        limits={},
        env=[
            {
                "name": "NVIDIA_VISIBLE_DEVICES",
                "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}},
            }
        ],
    )
    assert "NVIDIA_VISIBLE_DEVICES=valueFrom.secretKeyRef" in refused(review(from_secret))
    # hiding every GPU is what such a pod may ask for
    for hidden in ("void", "none"):
        hiding = gpu_pod(limits={}, env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": hidden}])
        assert answer(review(hiding))["allowed"] is True


def test_preload_and_mps_variables_stay_free_on_pods_without_gpushare_resources() -> None:
    env = [
        {"name": "LD_PRELOAD", "value": "/usr/lib/libjemalloc.so"},
        {"name": "GPUSHARE_MODE", "value": "mine"},
        {"name": "CUDA_MPS_PIPE_DIRECTORY", "value": "/tmp/mps"},
    ]
    assert answer(review(gpu_pod(limits={"nvidia.com/gpu": "1"}, env=env)))["allowed"] is True
    core_only = gpu_pod(limits={MEM: "2", CORE: "30"}, env=env[:1])
    assert "LD_PRELOAD" in refused(review(core_only))


def test_env_from_with_a_prefix_that_can_make_an_owned_name_is_refused() -> None:
    for prefix, owned in (
        ("NVIDIA_", "NVIDIA_VISIBLE_DEVICES"),
        ("GPUSHARE_X", "GPUSHARE_*"),
        ("CUDA_", "CUDA_MPS_*"),
        ("L", "LD_PRELOAD"),
    ):
        pod = gpu_pod()
        pod["spec"]["containers"][0]["envFrom"] = [
            {"prefix": prefix, "configMapRef": {"name": "cm"}}
        ]
        message = refused(review(pod))
        assert f"(spec.containers[0].envFrom[0]): prefix '{prefix}'" in message
        assert owned in message
    # without a prefix the keys cannot be seen here (see the module's limits): allowed
    pod = gpu_pod()
    pod["spec"]["containers"][0]["envFrom"] = [
        {"configMapRef": {"name": "cm"}},
        {"prefix": "APP_", "secretRef": {"name": "s"}},
    ]
    assert answer(review(pod))["allowed"] is True


# 4. spec.nodeName on a pod asking for gpushare resources -------------------------------------


def test_node_name_on_a_gpu_pod_create_is_refused() -> None:
    message = refused(review(gpu_pod(node="gpu-node-1")))
    assert (
        "spec.nodeName='gpu-node-1' is refused on a pod that asks for aliyun.com/gpu-mem" in message
    )
    assert "remove spec.nodeName" in message and "nodeSelector" in message
    # a pod without gpushare resources may name its node
    assert answer(review(gpu_pod(limits={"cpu": "1"}, node="n1")))["allowed"] is True
    # a trusted identity may
    assert answer(review(gpu_pod(node="gpu-node-1"), user=EXTENDER), trusting(EXTENDER))["allowed"]


def test_node_name_in_a_gpu_workload_template_is_refused() -> None:
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d", "namespace": "team-a"},
        "spec": {"template": gpu_pod(node="gpu-node-1")},
    }
    request = review(deployment)
    request["request"]["kind"] = {"group": "apps", "version": "v1", "kind": "Deployment"}
    assert "spec.template.spec.nodeName='gpu-node-1'" in refused(request)


# 5. UPDATE: adding, changing or removing hand-off annotations --------------------------------


def test_update_tampering_by_a_tenant_is_refused() -> None:
    before = bound()
    changed = copy.deepcopy(before)
    changed["metadata"]["annotations"]["gpushare.io/allocation"] = ALLOCATION.replace("15", "1")
    assert 'metadata.annotations["gpushare.io/allocation"] changed from' in refused(
        review(changed, "UPDATE", before)
    )
    removed = copy.deepcopy(before)
    del removed["metadata"]["annotations"]["ALIYUN_COM_GPU_MEM_IDX"]
    assert "metadata.annotations[\"ALIYUN_COM_GPU_MEM_IDX\"] removed (it was '0')" in refused(
        review(removed, "UPDATE", before)
    )
    added = copy.deepcopy(before)
    added["metadata"]["annotations"]["gpushare.io/seal"] = "forged"
    assert "metadata.annotations[\"gpushare.io/seal\"] added as 'forged'" in refused(
        review(added, "UPDATE", before)
    )
    unbound = gpu_pod()
    stamped = gpu_pod(annotations={"gpushare.io/allocation": ALLOCATION})
    refused(review(stamped, "UPDATE", unbound))


def test_unchanged_annotations_on_update_pass() -> None:
    before = bound()
    relabelled = copy.deepcopy(before)  # `kubectl label` re-sends the whole object
    relabelled["metadata"]["labels"] = {"team": "a"}
    relabelled["metadata"]["finalizers"] = []
    assert answer(review(relabelled, "UPDATE", before))["allowed"] is True


def test_the_extenders_bind_and_unbind_pass() -> None:
    settings = trusting(EXTENDER, PLUGIN)
    pending = gpu_pod()
    placed = bound()
    placed["spec"].pop("nodeName")  # annotations come before the binding
    assert answer(review(placed, "UPDATE", pending, user=EXTENDER), settings)["allowed"] is True
    assert answer(review(pending, "UPDATE", placed, user=EXTENDER), settings)["allowed"] is True
    # a trusted group works too (for operators who add one)
    group = trusting(groups=("gpushare:writers",))
    assert answer(review(placed, "UPDATE", pending, user="x", groups=("gpushare:writers",)), group)[
        "allowed"
    ]


# 5b. Volumes over the isolation's mounts ------------------------------------------------------


@pytest.mark.parametrize(
    ("mount_path", "covered"),
    [
        ("/etc/ld.so.preload", "/etc/ld.so.preload"),
        ("/etc/gpushare/limits", "/etc/gpushare"),
        ("/usr/local/gpushare/libgpushare-cuda.so", "/usr/local/gpushare"),
        ("/var/run/gpushare/gpushare-usage.v1", "/var/run/gpushare"),
        ("/run/gpushare/gpushare-usage.v1", "/run/gpushare"),
        ("/var/run/gpushare-mps", "/var/run/gpushare-mps"),
        ("//etc/./gpushare/", "/etc/gpushare"),
        ("/var/run/gpushare-sched", "/var/run/gpushare-sched"),
        ("/run/gpushare-sched", "/run/gpushare-sched"),
        ("/run/gpushare-sched/x", "/run/gpushare-sched"),
        ("/var/run/gpushare-sched/gpu0", "/var/run/gpushare-sched"),
    ],
)
def test_a_volume_over_the_isolation_is_refused_on_a_gpu_pod(mount_path: str, covered: str) -> None:
    pod = gpu_pod()
    pod["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "data", "mountPath": "/data"},
        {"name": "fake", "mountPath": mount_path, "subPath": "limits"},
    ]
    message = refused(review(pod))
    assert (
        f"container \"main\" (spec.containers[0].volumeMounts[1]): mountPath='{mount_path}' is "
        f"refused on a pod that asks for {MEM}: the device plugin mounts the GPU isolation at "
        f"{covered}"
    ) in message
    assert "/data" not in message


@pytest.mark.parametrize(
    ("kind", "group", "template_at"),
    [
        ("Deployment", "apps", ("spec", "template")),
        ("Job", "batch", ("spec", "template")),
        ("CronJob", "batch", ("spec", "jobTemplate", "spec", "template")),
    ],
)
def test_a_volume_over_the_schedules_in_a_workload_template_is_refused(
    kind: str, group: str, template_at: tuple[str, ...]
) -> None:
    """An emptyDir over the cGPU schedules: the tenant would write its own slices."""
    template = gpu_pod()
    template["spec"]["volumes"] = [{"name": "sched", "emptyDir": {}}]
    template["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "sched", "mountPath": "/var/run/gpushare-sched"}
    ]
    workload: dict[str, Any] = {
        "apiVersion": f"{group}/v1",
        "kind": kind,
        "metadata": {"name": "w", "namespace": "team-a"},
    }
    inner: dict[str, Any] = workload
    for key in template_at[:-1]:
        inner = inner.setdefault(key, {})
    inner[template_at[-1]] = template
    request = review(workload)
    request["request"]["kind"] = {"group": group, "version": "v1", "kind": kind}
    at = ".".join(template_at)
    assert (
        f'container "main" ({at}.spec.containers[0].volumeMounts[0]): '
        f"mountPath='/var/run/gpushare-sched' is refused on a pod that asks for {MEM}: the device "
        f"plugin mounts the GPU isolation at /var/run/gpushare-sched, and a volume at that path "
        f"or below it replaces what the plugin put there; mount the volume elsewhere"
    ) in refused(request)


def test_volumes_beside_the_isolation_pass_and_other_pods_mount_anywhere() -> None:
    pod = gpu_pod()
    pod["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "etc", "mountPath": "/etc/app"},
        {"name": "lib", "mountPath": "/usr/local/gpushare-tools"},
        {"name": "sched", "mountPath": "/run/gpushare-schedules"},
        {"name": "run", "mountPath": "/var/run"},
    ]
    assert answer(review(pod))["allowed"] is True
    plain = gpu_pod(limits={"cpu": "1"})
    plain["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "x", "mountPath": "/etc/ld.so.preload"}
    ]
    assert answer(review(plain))["allowed"] is True


# 6. Ephemeral containers (UPDATE on pods/ephemeralcontainers) ---------------------------------


def test_ephemeral_container_env_is_refused() -> None:
    before = bound()
    after = copy.deepcopy(before)
    after["spec"]["ephemeralContainers"] = [
        {
            "name": "debugger",
            "image": "cuda",
            "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
        }
    ]
    request = review(after, "UPDATE", before, sub_resource="ephemeralcontainers")
    message = refused(request)
    assert (
        "container \"debugger\" (spec.ephemeralContainers[0].env[0]): NVIDIA_VISIBLE_DEVICES='all'"
        in message
    )
    preload = copy.deepcopy(after)
    preload["spec"]["ephemeralContainers"][0]["env"] = [{"name": "LD_PRELOAD", "value": "x.so"}]
    assert "LD_PRELOAD='x.so'" in refused(
        review(preload, "UPDATE", before, sub_resource="ephemeralcontainers")
    )
    # a plain debug container passes
    plain = copy.deepcopy(after)
    plain["spec"]["ephemeralContainers"][0].pop("env")
    assert answer(review(plain, "UPDATE", before, sub_resource="ephemeralcontainers"))["allowed"]


def test_a_kept_violation_on_update_is_a_warning_not_a_refusal() -> None:
    # an ephemeral container that predates the webhook cannot be removed; adding another
    # debug container must not be blocked by it
    old = bound()
    old["spec"]["ephemeralContainers"] = [
        {"name": "old", "image": "x", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}
    ]
    new = copy.deepcopy(old)
    new["spec"]["ephemeralContainers"].append({"name": "new", "image": "x"})
    response = answer(review(new, "UPDATE", old, sub_resource="ephemeralcontainers"))
    assert response["allowed"] is True
    (warning,) = response["warnings"]
    assert "keeps" in warning and "NVIDIA_VISIBLE_DEVICES='all'" in warning
