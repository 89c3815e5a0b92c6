"""The fake GPUs' UUIDs: in NVML's form, so the limits file names them as it names real GPUs."""

from __future__ import annotations

from gpushare.isolation.limits import UUID_FORM
from gpushare.node.gpus import FakeGpus, fake_uuid


def test_each_fake_gpu_has_an_nvml_uuid_of_its_node_and_index() -> None:
    gpus = FakeGpus.parse("3x15GiB", node="gpushare-real-0").gpus()
    uuids = [g.uuid for g in gpus]
    assert all(UUID_FORM.fullmatch(u) for u in uuids), uuids
    assert uuids == [fake_uuid("gpushare-real-0", i) for i in range(3)]
    assert len(set(uuids)) == 3
    # the same on every start and on every machine; another node's GPUs differ
    assert fake_uuid("gpushare-real-0", 0) == "GPU-d3281c79-5f0f-562f-aac1-6d7d88fada7d"
    assert not set(uuids) & {g.uuid for g in FakeGpus.parse("3x15GiB", node="other").gpus()}
