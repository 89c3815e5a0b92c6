"""The records: what a bind writes on a pod, and what every reader may believe of it.

- ``allocation``: the allocation (GPUs, memory, cores per container) and its annotations.
- ``trust``: seals over allocations, and which allocations count (``Trust``, ``Judged``).
- ``handoff``: the hand-off from scheduler to device plugin, made provable.
- ``binding``: what a bind finds when the pod is already bound.
- ``gpuuse``: a node's GPU memory in use, as its device plugin published it.
- ``readmission``: GPU pods kubelet refused because no device plugin served them.

Above the model; below booking, which counts these records.
"""
