"""The validating admission webhook: HTTPS adapter around ``core.admission.decide``."""
