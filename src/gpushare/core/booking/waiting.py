"""The GPU pods the filter refused, to be tried again when GPUs come back.

kube-scheduler moves a pod it could not place back to its active queue on a cluster event its
plugins say may help (a pod deleted, a node changed), and otherwise after 5 minutes in its
unschedulable queue (``podMaxInUnschedulablePodsDuration``). An intent given back (its
deadline passed with no bind: the pod waits in PreBind, say for a volume that is never
provisioned, or kube-scheduler gave up on it) frees GPUs without any such event, so a pod
refused while the intent held them would wait those 5 minutes for capacity that came back long
before. The extender remembers the pods it refused for want of GPU (``Waiting``), and when
capacity comes back it touches each one (an annotation), which kube-scheduler's queue takes as
an update of the pod itself: a pod that only the extender refused has no plugin whose queueing
hint could say no, so it goes back to be scheduled after its back-off.

The book is bounded and taken in order of refusal, oldest first, a few pods at a time
(``take``), so a crowd of refused pods costs a bounded rate of API writes. Only pods refused
before the capacity came back are taken (``mark``): a pod taken is forgotten, and one refused
again afterwards waits for the next time capacity comes back, so touching pods never feeds
itself.

kube-scheduler also tries its refused pods again on the events it sees itself, a pod deleted
among them; but it follows the API server through its own watch, and when the extender's watch
lags behind it, the pod is filtered again while the extender still counts the deleted pod, is
refused once more, and then waits for the next event or those 5 minutes. So when the extender's
watch shows GPU share given back, the pods refused in the last few seconds are due too
(``extender.intents``, ``take``'s ``after``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WaitingPod:
    """A pod the filter refused for want of GPU."""

    uid: str
    namespace: str
    name: str


class Waiting:
    """Refused GPU pods in order of refusal, at most ``limit`` of them (the oldest drop out)."""

    def __init__(self, *, limit: int = 10_000) -> None:
        if limit < 1:
            raise ValueError(f"Waiting limit={limit} is refused: it must be at least 1")
        self._limit = limit
        self._pods: dict[str, tuple[int, WaitingPod]] = {}
        """By UID: (when it was refused, in refusals counted; the pod), oldest first."""
        self._refusals = 0

    def __len__(self) -> int:
        return len(self._pods)

    def __contains__(self, uid: object) -> bool:
        return uid in self._pods

    def refused(self, pod: WaitingPod) -> None:
        """Remember a refused pod, as the newest; the oldest is forgotten past the limit."""
        self._pods.pop(pod.uid, None)
        self._pods[pod.uid] = (self._refusals, pod)
        self._refusals += 1
        while len(self._pods) > self._limit:
            del self._pods[next(iter(self._pods))]

    def forget(self, uid: str) -> None:
        """The pod fits somewhere now, or is bound or gone: nothing to wait for."""
        self._pods.pop(uid, None)

    def mark(self) -> int:
        """Now, for ``take``: pods refused from here on are not taken before the next mark."""
        return self._refusals

    def take(self, count: int, *, before: int, after: int = 0) -> list[WaitingPod]:
        """Up to ``count`` of the oldest pods refused before the ``before`` mark and not before
        the ``after`` mark, forgotten here until they are refused again."""
        taken: list[WaitingPod] = []
        for refused_at, pod in self._pods.values():
            if len(taken) >= count or refused_at >= before:
                break
            if refused_at >= after:
                taken.append(pod)
        for pod in taken:
            del self._pods[pod.uid]
        return taken
