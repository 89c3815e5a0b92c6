"""The decision framework: one pod on one node, cached, behind the scheduler's facade.

- ``decider``: one pod on one node, the decision every way in shares (``Decider``).
- ``cache``: the decision cache, by node state and pod shape (``DecisionCache``).
- ``scheduling``: the facade the adapters call (``Scheduler``): read, filter, prioritize,
  intend, reserve and unreserve.

The top floor of the core.
"""
