"""The kube-scheduler extender: HTTP adapter around the core's filter, score and reserve.

- ``app``: the HTTP service (FastAPI): filter, prioritize, bind, inspect and probes.
- ``service``: the parts put together, split by verb.
- ``filtering``: filter and prioritize: which nodes fit a pod, and in what order.
- ``binding``: bind, its outcomes as values.
- ``intents``: intents and refused pods, the memory between filter, prioritize and bind.
- ``autoscaling``: placeholder pods and the scale-down guard, written by the leading replica.
- ``readmitting``: the GPU pods kubelet refused while no device plugin served them, back.
- ``telling``: the Events on pods and ResourcePolicies, and their counters.
- ``events``: the Events themselves, deduplicated.
- ``metrics``: Prometheus metrics, on a registry the app owns.
- ``wire``: the extender wire format (k8s.io/kube-scheduler/extender/v1), spelled exactly.
- ``draallocator``: DRA mode: gated pods' claims allocated with gpushare's placement, the gate
  removed (leading replica only).
- ``leadership``: which replica leads (its kube-scheduler holds the Lease), for both loops.
- ``driver``: calls the extender as kube-scheduler does, for the demo and the tests.
"""
