"""Isolation of GPU shares inside the containers.

- ``gpushare.isolation.share``: on ``share`` nodes, apply the container's memory share to the
  framework the app uses (nothing enforces it).
- ``gpushare.isolation.native``: the ``LD_PRELOAD`` interposer the device plugin injects on
  ``cgpu`` and ``core_mem`` nodes (built by ``gpushare.isolation.build``).
"""
