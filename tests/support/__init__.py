"""What the tests share, in one place: test modules import from here, never from each other.

- ``rig``: the extender app in-process over ASGI on an in-memory cluster (``Rig``).
- ``scraping``: the extender's ``/metrics`` scraped and read.
- ``pluginrig``: the device plugin in-process before a fake kubelet (``Rig``).
- ``fake_kubelet``: kubelet's side of the device plugin API, on temporary unix sockets.
- ``isolating``: the isolation hooks in the plugin rig.
- ``grpc_loop``: the one event loop the gRPC clients and servers of the tests run on.
- ``admission``, ``tampering``: AdmissionReview requests, by workload and by user.
- ``jsonpatching``: a JSON Patch applied as the API server would, to check a patched pod.
- ``platform_nodes``: nodes as GKE, EKS, Bottlerocket, AKS, OpenShift, k3s and RKE2 write them.
- ``nvidia_shapes``: the pods and plugins of NVIDIA's GPU Operator, as the admission sees them.
- ``properties``: random clusters and request streams (hypothesis) and their invariant.
- ``policies``: ResourcePolicy objects and the nodes their units select.
- ``inspecting``: the views and explanations the inspect tests share.
- ``kubeconfigs``: a kubeconfig and a cluster with pods, for the CLIs.
- ``chart``: the chart rendered by the pinned helm, and finding objects in it.
- ``promql``: samples as Prometheus holds them after scraping several targets.
- ``promqlengine``: Prometheus's own parser and engine (``promqlcheck/``, a Go test binary).
- ``dra``: DRA mode on the loopback cluster: the webhook with ``--dra``, the driver's mode and
  slice, the claims of a namespace watched and what a converted pod's container must see.
- ``e2e``: the end-to-end fixtures (one control plane a session, the real node) and helpers.
- ``realchart``: the chart installed on the real node: its values, components and ``helm test``.
- ``realnode``: pods on the real node, created, waited for and compared with the bookings.
- ``releasetools``: the release's tools (oras, crane, krew, ...) at packaging/tools.sh's versions.
- ``pki``: a CA and a serving certificate signed by it, for the webhook's TLS.
- ``benchmarks``: the benchmark scripts loaded as modules, for tests that run them small.
"""
