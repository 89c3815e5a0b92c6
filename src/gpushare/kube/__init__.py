"""Adapters to the Kubernetes API: a port, an in-memory cluster, lightkube, and a watch cache."""
