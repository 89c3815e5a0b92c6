"""Isolation of GPU shares inside the containers.

- ``share``: on ``share`` nodes, the container's memory share applied to the app's framework
  (nothing enforces it).
- ``limits``: the limits file, a container's GPU share where the container cannot change it.
- ``accounting``: a container's GPU memory account, as the broker keeps it (pure).
- ``policy``: the cGPU computing-power policies, how the containers of a GPU share its time.
- ``build``: builds the ``LD_PRELOAD`` interposer in ``native/`` that the device plugin injects
  on ``cgpu`` and ``core_mem`` nodes.
"""
