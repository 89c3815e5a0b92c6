"""The validating admission webhook: HTTPS adapter around ``core.admitting.admission.decide``.

- ``app``: the HTTP service (FastAPI): ``/validate`` over TLS, ``/mutate``, probes, metrics.
- ``dratemplates``: the ResourceClaimTemplate of a pod converted in DRA mode, created once.
- ``certs``: the serving certificate, served anew when its files change.
- ``configuration``: the webhook configurations that point the API server at the webhook.
- ``policy``: the hand-off ValidatingAdmissionPolicy, for while the webhook is down.
- ``noderestriction``: the ValidatingAdmissionPolicies that hold the device plugin to its node.
"""
