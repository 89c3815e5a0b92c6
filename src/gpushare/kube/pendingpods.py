"""The extender's pods that kube-scheduler has not placed yet, each kept as compact bytes.

A burst of pods created at once waits for kube-scheduler, and the extender keeps every one of
them until it is bound: bind starts from the watch's copy (``extender.binding``), intents ask
whether a pod is still pending and in which namespace. Kept as the API server gives it, such a
pod cost the cache about 11 KiB; what the core reads of it (``read_fields``) is still about
2.6 KiB of dicts and strings, most of that the dicts themselves. Kept serialised it is about
0.6 KiB, read back only when bind or an expired intent asks for it (a few µs), never by the
filter, which asks only whether a UID is pending.

So a pending burst of 24,500 pods, which set the extender's peak at 5,000 nodes and 50,000
pods (docs/operations.md, sizing), costs 14.1 MiB instead of 258.4 MiB
(``benchmarks/pending_memory.py --pods 24500``).
"""

from __future__ import annotations

import marshal
from collections.abc import Iterator, MutableMapping

from gpushare.core.model.kubejson import KubeObject, read_fields
from gpushare.kube.port import KubeDict


class PendingPods(MutableMapping[str, KubeDict]):
    """Unbound pods by UID: what the core reads of each, stored as bytes.

    A pod put in is narrowed to ``read_fields`` and serialised with ``marshal``, which takes
    back exactly what went in (any int, a float's every bit, ``inf``; JSON would not) and is
    never read outside this process; each read builds a new dict, which its reader may keep
    or change without touching the store. An object ``marshal`` refuses (only a test builds
    one: the API's JSON never holds such a value) is kept as narrowed, and read as it is.
    """

    __slots__ = ("_pods",)

    def __init__(self) -> None:
        self._pods: dict[str, bytes | KubeDict] = {}

    def __getitem__(self, uid: str) -> KubeDict:
        kept = self._pods[uid]
        if isinstance(kept, bytes):
            pod: KubeDict = marshal.loads(kept)
            return pod
        return kept

    def __setitem__(self, uid: str, pod: KubeObject) -> None:
        fields = read_fields(pod)
        try:
            self._pods[uid] = marshal.dumps(fields)
        except ValueError:  # a value no JSON decoder gives (a test's object): kept as it is
            self._pods[uid] = fields

    def __delitem__(self, uid: str) -> None:
        del self._pods[uid]

    def __contains__(self, uid: object) -> bool:
        return uid in self._pods

    def __iter__(self) -> Iterator[str]:
        return iter(self._pods)

    def __len__(self) -> int:
        return len(self._pods)
