"""A kubeconfig and a cluster with pods, for the CLIs that read the API."""

from __future__ import annotations

from gpushare.core.model.inventory import Mode
from gpushare.kube.memory import MemoryKube
from gpushare.kube.objects import gpu_node, gpu_pod

KUBECONFIG = """apiVersion: v1
kind: Config
clusters:
- name: nowhere
  cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}
users:
- name: nobody
  user: {token: abc}
contexts:
- name: nowhere
  context: {cluster: nowhere, user: nobody}
current-context: nowhere
"""


def kube_with_pods() -> MemoryKube:
    kube = MemoryKube()
    kube.put_node(gpu_node("node-a", gpus_units=[15]))
    kube.put_node(gpu_node("node-b", gpus_units=[15, 15], mode=Mode.CGPU))
    kube.create_pod(gpu_pod("big", mem=20, namespace="ml"))
    kube.create_pod(gpu_pod("small", mem=3, namespace="ml"))
    return kube
