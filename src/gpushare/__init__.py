"""gpushare: shared GPU scheduling for Kubernetes, speaking ACK's ``aliyun.com/gpu-mem``.

Its packages, each a layer of an import contract in ``pyproject.toml`` (lower ones never import
higher ones), and the modules every layer may share:

- ``cli``: the ``gpushare`` command, one module per command or family.
- ``extender``, ``deviceplugin``, ``dra``, ``webhook``, ``sim``: the adapters (scheduler
  extender, kubelet device plugin, DRA kubelet plugin, admission webhook, simulator), which never
  import each other.
- ``node``: what every node driver (the device plugin, the DRA driver) shares: the GPUs,
  preflight, publishing, usage, CDI and the enforcement of each container's share.
- ``inspect``, ``isolation``: ``kubectl inspect cgpu``; the isolation inside the containers.
- ``kube``: the Kubernetes API behind a port, an in-memory cluster, the watches.
- ``core``: the pure scheduling core.
- ``demo``: the seed walkthrough in one process.
- ``config``: validated settings at the edge; the core gets frozen dataclasses.
- ``crds``: the ResourcePolicy CustomResourceDefinition, rendered from one place.
- ``schedconfig``: the KubeSchedulerConfiguration that wires kube-scheduler to the extender.
- ``exporting``, ``scraping``, ``servingcert``: what every ``/metrics`` server exports besides
  its own series, the guard in front of it, and its self-signed certificate.
"""

__version__ = "0.2.0.dev0"
__all__ = ["__version__"]
