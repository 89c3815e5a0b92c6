"""Admission: the webhook's decision, and what only gpushare may write.

- ``admission``: an AdmissionReview request in, its response out.
- ``tampering``: the hand-off annotations, variables and mounts a pod may not carry itself.
- ``isolationpaths``: the container paths where the GPU isolation is mounted.

Above the model only; independent of ResourcePolicy.
"""
