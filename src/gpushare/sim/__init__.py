"""The simulator: replay a workload against a cluster through gpushare's scheduling policies."""
