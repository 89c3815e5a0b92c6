"""Admission keeps free every path the device plugin mounts, in every mode and cGPU policy.

The paths come from what Allocate really answers over gRPC (the fake kubelet records the
mounts), not from a list written here: a mount the plugin adds later is checked as soon as it
is added. A volume of the pod's own at such a path, or below it, or at the same path under
``/run`` (most images link ``/var/run`` to it), would replace what the plugin put there.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpushare.core.model.inventory import Mode
from gpushare.isolation.policy import Policy
from tests.support.isolating import admit, fake_library, isolation
from tests.support.pluginrig import CORE, Rig, pod, run
from tests.support.tampering import MEM, gpu_pod, refused, review

SETUPS = [
    (Mode.SHARE, Policy.NATIVE),
    *((Mode.CGPU, policy) for policy in Policy),
    (Mode.CORE_MEM, Policy.NATIVE),
    (Mode.MPS, Policy.NATIVE),
]


def allocated_mounts(mode: Mode, policy: Policy) -> set[str]:
    """The container paths of every mount Allocate gives a memory (and core) container."""

    async def body(r: Rig) -> set[str]:
        await r.kubelet.wait_devices(MEM, 30)
        if mode is Mode.CORE_MEM:
            await r.kubelet.wait_devices(CORE, 200)  # 100 a GPU
        _, admitted = await admit(r, pod("app", 2, core=30 if mode is Mode.CORE_MEM else None))
        return {path for path, _, _ in admitted.mounts.get("c0", ())}

    result: set[str] = run(
        body, mode=mode, hook=isolation(packaged=fake_library(), cgpu_policy=policy)
    )
    return result


def variants(path: str) -> list[str]:
    """The path, a file below it, and the same two under the other name of ``/var/run``."""
    names = [path]
    for one, other in (("/var/run/", "/run/"), ("/run/", "/var/run/")):
        if path.startswith(one):
            names.append(other + path.removeprefix(one))
    return [p for name in names for p in (name, f"{name}/x")]


@pytest.mark.parametrize(("mode", "policy"), SETUPS, ids=lambda v: str(getattr(v, "name", v)))
def test_admission_refuses_a_volume_over_every_mount_allocate_gives(
    mode: Mode, policy: Policy
) -> None:
    mounts = allocated_mounts(mode, policy)
    if mode.isolated:
        assert mounts, f"{mode.value} policy {int(policy)}: Allocate mounted nothing"
    for mounted in sorted(mounts):
        for path in variants(mounted):
            manifest: dict[str, Any] = gpu_pod()
            manifest["spec"]["containers"][0]["volumeMounts"] = [
                {"name": "mine", "mountPath": path}
            ]
            message = refused(review(manifest))
            assert f"mountPath={path!r} is refused on a pod that asks for {MEM}" in message, (
                mode,
                policy,
                mounted,
            )
