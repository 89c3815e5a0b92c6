"""End-to-end fixtures and the collection hook (``tests/support/e2e.py`` holds them).

These tests run only with ``GPUSHARE_E2E=1`` (``make e2e`` and ``make test`` set it), because
they build and start the upstream binaries; plain ``pytest`` skips them.
"""

from tests.support.e2e import cluster, pytest_collection_modifyitems, real_node
from tests.support.realnode import ns

__all__ = ["cluster", "ns", "pytest_collection_modifyitems", "real_node"]
