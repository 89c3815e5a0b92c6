"""Operational tooling around gpushare, not part of the product and not tests.

What the end-to-end tests, the benchmarks and the Makefile share to run gpushare against real
Kubernetes processes on this machine:

- ``cluster``: etcd, kube-apiserver, kube-scheduler and kwok on loopback, the extender in
  front; ``controlplane/`` builds their binaries.
- ``clusterctl``: ``make cluster``, a control plane for a person, with the seeds' nodes.
- ``realnode``: a real kubelet and containerd with the device plugin, on one node; ``node/``
  sets the machine up.
- ``images``: the test images the real node runs, built from Debian packages.
- ``cdi_double``, ``podresources_double``: what a GPU node would have (the CDI spec,
  kubelet's PodResources for kwok nodes).
- ``identities``: the chart's identities for the components the e2e tests run.
- ``image_archive``, ``previous_release``: the chart's images as archives
  (``make image-archive``), this release's and the last one's.
- ``staged``, ``seeding``, ``helpers``: creating nodes and pods in bulk and timing them.
- ``platforms``: managed platforms' GPU node shapes (read-only and noexec host paths, a driver
  root, a second plugin, admission rules) laid over the real node and undone.
- ``autoscalers``: cluster-autoscaler and Karpenter (kwok providers) beside the cluster;
  ``controlplane/autoscalers.sh`` builds them.
- ``dra``: DRA mode on kwok nodes: the driver's ResourceSlices published as it would (no
  kubelet there for it), the DeviceClass, claim templates and pods written by hand.
- ``reaping``, ``ports``: finding and stopping what a run left behind; free ports.
- ``fakegpu``: a fake GPU node on the CPU (fake driver and NVML, the interposer built on them).
- ``hostile``: hostile values for every field and annotation gpushare reads (the hostile-input
  test and benchmark).
"""
