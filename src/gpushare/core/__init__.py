"""The pure scheduling core: no API client, HTTP, gRPC, NVML or socket imports live here.

Adapters (extender, inspect, demo, simulator) hand it plain Kubernetes JSON dicts and get
values back: verdicts with reasons, placements, ledgers. That keeps every decision testable
without a cluster and makes the demo and the simulator run the same code as the extender.
"""
