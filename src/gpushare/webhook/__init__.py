"""The validating admission webhook: HTTPS adapter around ``core.admitting.admission.decide``."""
