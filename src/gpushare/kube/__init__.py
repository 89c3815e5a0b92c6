"""Adapters to the Kubernetes API: a port, an in-memory cluster, lightkube, and a watch cache.

- ``port``: the Kubernetes API as gpushare needs it, a port with its own error tree.
- ``memory``: an in-memory API (resourceVersions, conflicts, bindings, watches).
- ``lightkube_api``: the port over lightkube, the only module that imports it.
- ``cache``: the extender's list-then-watch cache of nodes and pods.
- ``pendingpods``: the pods kube-scheduler has not placed yet, kept as compact bytes.
- ``policies``: a list-then-watch of ResourcePolicies into the PolicyBook.
- ``podwatch``: the pods bound to one node, for the device plugin.
- ``mirror``: objects of one kind, list-then-watch (DRA mode's slices, claims and nodes).
- ``watchhealth``: whether the API server refuses a list or watch, and why.
- ``backoff``: how long to wait before asking the API server again after a failure.
- ``objects``: builders of the objects the demo, the tests and the simulator create.
- ``sealing``: the seal key from a file, a Secret or the in-memory cluster.
- ``metricsguard``: a ``/metrics`` request's token reviewed by the API server, remembered.
"""
