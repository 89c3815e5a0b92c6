"""The kube-scheduler extender: HTTP adapter around the core's filter, score and reserve."""
