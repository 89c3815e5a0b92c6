"""The model: Kubernetes JSON read into values, the lowest floor of the core.

- ``kubejson``: typed access to plain pod and node dicts; pod phases.
- ``names``: resource, annotation and label names (the ACK-compatible ones and gpushare's).
- ``quantity``: Kubernetes quantities, with the API server's grammar and exact values.
- ``units``: the GPU memory unit (GiB, MiB, ...) a cluster counts in.
- ``shape``: whether a pod or node has the JSON shape the readers expect.
- ``containers``: init, sidecar and app containers, and how their amounts add up.
- ``hostresources``: a pod's CPU and memory requests, a node's allocatable.
- ``gpumodel``, ``topology``, ``disabling``: a node's GPU models, links and GPUs out of service.
- ``inventory``: a node read into its GPUs (``NodeInventory``).
- ``requests``, ``spreading``: a pod read into its validated GPU request (``PodRequest``) or a
  rejection with reasons, and its containers spread over its GPUs.
- ``startuptaint``: when a node's device plugin removes the autoscaler's startup taint.
- ``pluginserving``: whether a node labelled for sharing has a device plugin serving it (the
  extender's ``gpushare_node_device_plugin_missing``).
- ``platform``: which platform a node runs on (GKE, EKS, Bottlerocket, AKS, OpenShift, k3s,
  RKE2) and that platform's own switch for keeping its NVIDIA device plugin off the node.
- ``status``: how a check ended (``Status``: code, reasons, source), as the scheduler
  framework says it: the refusals of filter, reserve, bind and Allocate.
"""
