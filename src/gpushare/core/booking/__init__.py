"""Booking: who holds which GPUs, confirmed, assumed, intended.

- ``ledger``: the ledger, rebuilt from pod annotations alone; bookings and intents.
- ``changes``: change logs, which names changed since a position.
- ``unitchange``: whether a node's GPU memory unit may change now.
- ``waiting``: the GPU pods the filter refused, tried again when GPUs come back.

Above the records; below placement, which reads the ledger.
"""
