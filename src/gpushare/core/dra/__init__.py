"""DRA mode's pure core (docs/dra.md): what the driver publishes, the claims made from ACK
resources, the ledger read from allocated claims, and gpushare's allocation of a claim.

- ``names``: the DRA wire names (re-exported from core.model.names, their one home);
- ``slices``: the ResourceSlice a node publishes, and the GPUs read back from one;
- ``claims``: the claim template and pod patch a pod's ACK resources become;
- ``ledger``: slices and allocated claims read into the ledger's values (per node, per GPU, by
  claim and pod), with the results that do not count and why;
- ``allocate``: gpushare's placement of one pod's claim, and the claim status that records it.
"""
