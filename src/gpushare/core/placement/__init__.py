"""Placement: whether a pod fits a node, which GPUs it gets, and how nodes rank.

- ``filtering``: the verdict per node (fits, unschedulable, unresolvable) with reasons.
- ``placing``: GPU choice inside a node (best fit for binpack, most free for spread).
- ``scoring``, ``ranking``: node policies and scores; 0..10 priorities and the one top node.
- ``fragmentation``, ``scarcity``, ``survey``, ``pairing``, ``defragmenting``: the
  fragmentation-aware policies (fgd, gpushare): fragmentation measures, scarce shapes and their
  prices, the cluster survey, which shares should meet on one GPU, the node policies that use
  them.
- ``preferences``: whether kube-scheduler's own scores could prefer another fitting node.
- ``explain``: sentences that explain a placement or a refusal to a person.

Above booking; below the decision framework and ResourcePolicy.
"""
