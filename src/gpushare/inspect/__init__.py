"""``kubectl inspect cgpu``: a view of the ledger, its renderers and the kubectl plugin."""
