"""Apply a ``share`` node's memory slice to the app's framework, in one line.

On ``share`` nodes nothing enforces the slice: the device plugin only tells the container its
size, and the app has to keep to it::

    import gpushare.isolation.share as s; s.apply()

The slice is ``ALIYUN_COM_GPU_MEM_CONTAINER`` out of ``ALIYUN_COM_GPU_MEM_DEV`` units of
``GPUSHARE_MEM_UNIT`` (1GiB when unset, as on ACK). ``GPUSHARE_MEM_PER_GPU`` (``index:units``
pairs), when present, gives each visible GPU its own share, in the order of the visible devices.

- PyTorch (already imported): ``torch.cuda.set_per_process_memory_fraction`` on each device.
- TensorFlow (already imported): one logical device with ``memory_limit`` (MiB) on each GPU;
  this only works before TensorFlow initialises the GPUs, so call ``apply()`` first thing.
- JAX: ``XLA_PYTHON_CLIENT_MEM_FRACTION`` is read when JAX starts its backend, so ``apply()``
  must run **before** ``import jax``; if JAX is already imported, the result says so.

Frameworks are not imported here (importing TensorFlow to configure an app that uses PyTorch
would cost seconds and memory); import yours first, except JAX. Pass ``frameworks=`` to name
them explicitly. A variable that is set but malformed raises :class:`ShareEnvError`; no
variables at all (not a gpushare container) applies nothing.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from gpushare.core.model.kubejson import whole_number
from gpushare.core.model.units import MemoryUnit

__all__ = ["Applied", "ShareEnvError", "Slice", "apply", "read_slice"]

CONTAINER = "ALIYUN_COM_GPU_MEM_CONTAINER"
DEV = "ALIYUN_COM_GPU_MEM_DEV"
UNIT = "GPUSHARE_MEM_UNIT"
PER_GPU = "GPUSHARE_MEM_PER_GPU"
JAX_FRACTION = "XLA_PYTHON_CLIENT_MEM_FRACTION"
FRAMEWORKS = ("torch", "tensorflow", "jax")


class ShareEnvError(ValueError):
    """A gpushare variable is malformed; the message names it, its value and the rule."""


@dataclass(frozen=True)
class Slice:
    """The container's memory slice, per visible device."""

    fractions: tuple[float, ...]
    """Share of each visible GPU, 0 < f <= 1, in visible-device order."""
    limits_mib: tuple[int, ...]
    """The same shares in MiB."""


@dataclass(frozen=True)
class Applied:
    """What ``apply`` did."""

    slice: Slice | None
    done: tuple[str, ...] = ()
    """One line per framework setting made, e.g. ``torch: device 0 fraction 0.2``."""
    skipped: tuple[str, ...] = field(default=())
    """Why a framework was left alone."""


def _count(env: Mapping[str, str], name: str, value: str) -> int:
    number = whole_number(value)
    if not number:
        raise ShareEnvError(f"{name}={value!r}: must be a whole number of memory units above 0")
    return number


def read_slice(env: Mapping[str, str]) -> Slice | None:
    """The slice the environment gives; None when it gives none."""
    if CONTAINER not in env:
        return None
    container = _count(env, CONTAINER, env[CONTAINER])
    if DEV not in env:
        raise ShareEnvError(f"{DEV} is not set but {CONTAINER} is: both come from the plugin")
    dev = _count(env, DEV, env[DEV])
    try:
        unit = MemoryUnit.parse(env.get(UNIT, MemoryUnit.GiB.value))
    except ValueError:
        raise ShareEnvError(f"{UNIT}={env[UNIT]!r}: must be 1GiB or 128MiB") from None
    shares = [container]
    if env.get(PER_GPU):
        shares = []
        for pair in env[PER_GPU].split(","):
            index, sep, amount = pair.partition(":")
            if not sep or whole_number(index) is None:
                raise ShareEnvError(
                    f"{PER_GPU}={env[PER_GPU]!r}: must be index:units pairs separated by commas"
                )
            shares.append(_count(env, PER_GPU, amount))
    for units in shares:
        if units > dev:
            raise ShareEnvError(
                f"{CONTAINER}={env[CONTAINER]!r} ({PER_GPU}={env.get(PER_GPU, '')!r}) is more "
                f"than {DEV}={env[DEV]!r}: a container's share of a GPU cannot exceed the GPU"
            )
    return Slice(
        fractions=tuple(units / dev for units in shares),
        limits_mib=tuple(units * unit.mib for units in shares),
    )


def _torch(module: Any, share: Slice) -> list[str]:
    if not module.cuda.is_available():
        return []
    out = []
    for device in range(min(module.cuda.device_count(), len(share.fractions))):
        module.cuda.set_per_process_memory_fraction(share.fractions[device], device)
        out.append(f"torch: device {device} fraction {share.fractions[device]:.4g}")
    return out


def _tensorflow(module: Any, share: Slice) -> list[str]:
    out = []
    gpus = module.config.list_physical_devices("GPU")
    for device, gpu in enumerate(gpus[: len(share.limits_mib)]):
        limit = share.limits_mib[device]
        try:
            module.config.set_logical_device_configuration(
                gpu, [module.config.LogicalDeviceConfiguration(memory_limit=limit)]
            )
        except RuntimeError as err:
            raise RuntimeError(
                f"tensorflow initialised its GPUs before gpushare could limit them ({err}); "
                f"call gpushare.isolation.share.apply() before building any model or tensor"
            ) from err
        out.append(f"tensorflow: device {device} memory_limit {limit} MiB")
    return out


def apply(
    *,
    env: MutableMapping[str, str] | None = None,
    frameworks: Iterable[str] | None = None,
    modules: Mapping[str, Any] | None = None,
) -> Applied:
    """Apply the container's memory slice to the frameworks in use; say what was done.

    ``env`` defaults to ``os.environ`` (JAX's variable is written there), ``frameworks`` to the
    ones already imported plus JAX, ``modules`` to ``sys.modules`` (tests pass fakes).
    """
    environ: MutableMapping[str, str] = os.environ if env is None else env
    loaded: Mapping[str, Any] = sys.modules if modules is None else modules
    share = read_slice(environ)
    if share is None:
        return Applied(None, skipped=(f"{CONTAINER} is not set: not a gpushare container",))
    wanted = list(frameworks) if frameworks is not None else [*FRAMEWORKS]
    done: list[str] = []
    skipped: list[str] = []
    for name in wanted:
        if name not in FRAMEWORKS:
            raise ValueError(f"framework {name!r} is not supported: use one of {FRAMEWORKS}")
        if name == "jax":
            fraction = f"{min(share.fractions):.4g}"
            environ[JAX_FRACTION] = fraction
            done.append(f"jax: {JAX_FRACTION}={fraction}")
            if "jax" in loaded:
                skipped.append("jax: already imported, so its backend may ignore the fraction")
            continue
        module = loaded.get(name)
        if module is None and frameworks is not None:
            module = importlib.import_module(name)
        if module is None:
            skipped.append(f"{name}: not imported")
            continue
        steps = _torch(module, share) if name == "torch" else _tensorflow(module, share)
        done.extend(steps)
        if not steps:
            skipped.append(f"{name}: no GPU visible")
    return Applied(share, tuple(done), tuple(skipped))
