"""gpushare: shared GPU scheduling for Kubernetes, speaking ACK's ``aliyun.com/gpu-mem``."""

__version__ = "0.2.0.dev0"
__all__ = ["__version__"]
