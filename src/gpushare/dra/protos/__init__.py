"""gpushare's copies of kubelet's gRPC APIs for DRA drivers; their stubs are generated at build
(``deviceplugin.kubelet.genproto``).

- ``dra_v1``: the DRA plugin service (``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin``).
- ``pluginregistration_v1``: kubelet's plugin registration (``pluginregistration.Registration``).
"""
