"""The pure scheduling core: no API client, HTTP, gRPC, NVML or socket imports live here.

Adapters (extender, inspect, demo, simulator) hand it plain Kubernetes JSON dicts and get
values back: verdicts with reasons, placements, ledgers. That keeps every decision testable
without a cluster and makes the demo and the simulator run the same code as the extender.

Its subpackages, each a floor that imports only the floors below it (an import contract in
``pyproject.toml``), top first:

- ``decision``: the decision framework and the scheduler's facade;
- ``resourcepolicies``, ``admitting`` and ``autoscaling``: ResourcePolicy; the webhook's
  admission decision; what autoscalers must see (placeholders, the scale-down guard) (they
  never import each other);
- ``dra``: DRA mode (slices, claims made from ACK resources, the ledger read from claims,
  allocation);
- ``placement``: filtering, GPU choice, scoring, the fragmentation-aware policies;
- ``booking``: the ledger, change logs, refused pods;
- ``records``: allocations, seals, the hand-off;
- ``model``: Kubernetes JSON read into values.
"""
