"""What the tests share, in one place: test modules import from here, never from each other.

- ``benchmarks``: the benchmark scripts loaded as modules, for tests that run them small.
- ``e2e``: the end-to-end fixtures (one control plane a session, the real node) and helpers.
- ``fake_kubelet``: kubelet's side of the device plugin API, in-process.
- ``grpc_loop``: the one event loop the gRPC clients and servers of the tests run on.
- ``nvidia_shapes``: the pods and plugins of NVIDIA's GPU Operator, as the admission sees them.
- ``promql``: samples as Prometheus holds them after scraping several targets.
- ``promqlengine``: Prometheus's own parser and engine (``promqlcheck/``, a Go test binary).
- ``rig``: the extender app in-process over ASGI on an in-memory cluster (``Rig``).
"""
