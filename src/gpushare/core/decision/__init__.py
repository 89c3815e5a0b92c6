"""The decision framework: one pod on one node, cached, behind the scheduler's facade.

- ``decider``: one pod on one node, the decision every way in shares (``Decider``).
- ``cache``: the decision cache, by node state and pod shape (``DecisionCache``).
- ``scheduling``: the facade the adapters call (``Scheduler``): read, filter, prioritize,
  intend, reserve (``reserve_pod``: the ResourcePolicy unit and the GPUs, all or nothing) and
  unreserve (every store, idempotent).
- ``clusterstate``: the cluster as every decision reads it, in one owner (``ClusterState``:
  nodes, ledger, pending pods, scoring terms, ResourcePolicy book, trust, workload); taking an
  object in returns what changed (``NodeTaken``, ``PodTaken``, ``Relisted``).
- ``verbs``: the extender's verbs as one call each over the state, returning everything the
  adapter answers, counts and tells (``filter_pod`` with ``FilterOutcome``;
  ``prioritize_pod`` with ``PrioritizeOutcome``; ``reserve_bind`` with ``BindPlan`` or
  the try's ``Status``).
- ``yielding``: when another pod's intent gives way to a pod that fits nowhere while it stands
  (older than ``HOLD_S``, or younger than that pod), so that pods which never bind, however
  often they are created again, cannot hold GPUs from others.

The top floor of the core.
"""
