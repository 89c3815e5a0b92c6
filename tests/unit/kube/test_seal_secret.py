"""The chart's seal Job: the Secret made once in the cluster, never rewritten (issue 40)."""

from __future__ import annotations

import asyncio
import base64

from gpushare.kube.memory import MemoryKube
from gpushare.kube.sealing import ensure_secret, secret_key


def test_the_secret_is_created_once_and_then_kept_with_its_key() -> None:
    async def main() -> None:
        kube = MemoryKube()
        fine, said = await ensure_secret(kube, "gs", "gs-seal", {"app": "gpushare"})
        assert fine and said == "created Secret gs/gs-seal with a new seal key"
        first = await secret_key(kube, "gs", "gs-seal")
        assert not isinstance(first, str)
        fine, said = await ensure_secret(kube, "gs", "gs-seal", {"app": "gpushare"})
        assert fine and said == "kept Secret gs/gs-seal: it holds a seal key"
        assert await secret_key(kube, "gs", "gs-seal") == first  # a second run changes nothing
        stored = await kube.get_secret("gs", "gs-seal")
        assert stored["metadata"]["labels"] == {"app": "gpushare"}

    asyncio.run(main())


def test_a_secret_without_a_usable_key_is_reported_and_left_alone() -> None:
    async def main() -> None:
        kube = MemoryKube()
        broken = {"metadata": {"namespace": "gs", "name": "gs-seal"}, "data": {"key": "c2hvcnQ="}}
        kube.put_secret(broken)
        fine, said = await ensure_secret(kube, "gs", "gs-seal", {})
        assert not fine
        assert "it was left as it is" in said and "gpushare seal-key" in said
        stored = await kube.get_secret("gs", "gs-seal")
        assert base64.b64decode(stored["data"]["key"]) == b"short"

    asyncio.run(main())
