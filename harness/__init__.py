"""Operational tooling around gpushare, not part of the product and not tests.

What the end-to-end tests, the benchmarks and the Makefile share to run gpushare against real
Kubernetes processes on this machine:

- ``cluster``: etcd, kube-apiserver, kube-scheduler and kwok on loopback, the extender in
  front (``make cluster``); ``controlplane/`` builds their binaries.
- ``realnode``: a real kubelet and containerd with the device plugin, on one node; ``node/``
  sets the machine up, ``images`` builds the test images it runs, ``cdi_double`` and
  ``podresources_double`` stand in for what a GPU node would have.
- ``image_archive`` (``make image-archive``) and ``previous_release``: the chart's images as
  archives, this release's and the last one's.
- ``staged``, ``seeding``, ``helpers``: creating nodes and pods in bulk and timing them.
- ``reaping``, ``ports``: finding and stopping what a run left behind; free ports.
- ``fakegpu``: a fake GPU node on the CPU (fake driver and NVML, the interposer built on them).
- ``hostile``: hostile values for every field and annotation gpushare reads (the hostile-input
  test and benchmark).
"""
