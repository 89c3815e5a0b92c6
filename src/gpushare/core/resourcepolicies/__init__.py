"""ResourcePolicy (``scheduling.alibabacloud.com/v1alpha1``): units tried in order.

- ``resourcepolicy``: the spec, read and checked.
- ``gating``: which unit is open to a pod now, with reasons.
- ``policybook``: policies, placed pods and node labels, fed by the watches.
- ``policyplugin``: the policy as a scheduling plugin: filter, reserve, unreserve.

Above placement (its sentences), independent of admission; below the decision framework.
"""
