"""The device plugin: the node side of sharing (kubelet's v1beta1 API over unix sockets)."""
