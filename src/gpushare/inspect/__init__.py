"""``kubectl inspect cgpu``: a view of the ledger, its renderers and the kubectl plugin.

- ``view``: what the plugin shows, from inventories and the ledger alone (pure).
- ``explain``: ``--explain``, would this pod fit each node now, and if not why (pure).
- ``newnode``: whether ``--explain``'s pod waits for a new node (a placeholder), pure.
- ``dramode``: DRA mode's nodes (ResourceSlices) and holdings (ResourceClaims) in the view (pure).
- ``scope``: what is shown and what its user may see (pure).
- ``installed``: the installed extender's settings, read from its Deployment (pure).
- ``render``: text rendering of the view, in the seed documents' layout.
- ``schema``: the JSON documents ``-o json`` prints, as models with a JSON Schema.
- ``cli``: ``kubectl-inspect-cgpu``, the kubectl plugin.
- ``choices``: the values the options may take (contexts, namespaces, pods).
- ``completion``: ``kubectl_complete-inspect-cgpu``, completion as kubectl asks for it.
"""
