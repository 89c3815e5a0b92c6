"""Admission: the webhook's decision, what only gpushare may write, who may read /metrics.

- ``admission``: an AdmissionReview request in, its response out.
- ``draconverting``: the mutating webhook's DRA path: a new pod's ACK resources as a claim.
- ``tampering``: the hand-off annotations, variables and mounts a pod may not carry itself.
- ``isolationpaths``: the container paths where the GPU isolation is mounted.
- ``metricsaccess``: a ``/metrics`` request let in or not, from the token and access reviews.
- ``tolerations``: the tolerations the steering webhook adds to GPU pods that lack them.

Above the model only; independent of ResourcePolicy.
"""
