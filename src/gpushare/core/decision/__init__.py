"""The decision framework: one pod on one node, cached, behind the scheduler's facade.

- ``decider``: one pod on one node, the decision every way in shares (``Decider``).
- ``cache``: the decision cache, by node state and pod shape (``DecisionCache``).
- ``scheduling``: the facade the adapters call (``Scheduler``): read, filter, prioritize,
  intend, reserve (``reserve_pod``: the ResourcePolicy unit and the GPUs, all or nothing) and
  unreserve (every store, idempotent).
- ``verbs``: the extender's verbs as one call each, returning everything the adapter answers,
  counts and tells (``filter_pod`` with ``FilterOutcome``; ``reserve_bind`` with ``BindPlan``
  or ``BindResult``).

The top floor of the core.
"""
