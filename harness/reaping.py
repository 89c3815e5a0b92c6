"""Finding and stopping what runs for one cluster directory, whatever its pids file says.

A pids file goes stale: ``up`` may be killed before it writes it, a test may delete the directory
under a running cluster, and a pid it recorded may belong to another process by now (stopping
that one would be worse than stopping nothing). So ``cluster down`` asks the processes
themselves: every component of the loopback cluster is given paths inside the cluster directory
on its command line (etcd its data dir, kube-apiserver its certificates, the others their
kubeconfigs; the real node's containerd, shims, kubelet and device plugin their sockets and
state), so a process belongs to the directory when it is one of those components and one of its
arguments names the directory or a path below it. A sibling such as ``/tmp/c2`` does not belong
to ``/tmp/c``, and a process merely reading a log there (``tail -f``) is no component.

The matching (``component_of``, ``stop_order``) is pure; ``find_running`` reads ``/proc`` and
``stop`` signals.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

BINARIES = (
    "cluster-autoscaler",
    "karpenter-kwok",
    "gpushare-device-plugin",
    "gpushare-dra-driver",
    "kubelet",
    "containerd-shim-runc-v2",
    "containerd",
    "kwok",
    "kube-scheduler",
    "gpushare-extender",
    "gpushare-webhook",
    "kube-controller-manager",
    "kube-apiserver",
    "etcd",
)
"""The components, in the order they are stopped: clients before what they talk to, so each
exits on its signal instead of retrying a server that is already gone."""
GPUSHARE_COMMANDS = ("extender", "device-plugin", "dra-driver", "webhook")
"""``gpushare`` subcommands the cluster (or a test on it) runs as processes of their own."""


@dataclass(frozen=True)
class Found:
    """A running process that belongs to the cluster directory."""

    pid: int
    component: str


def names_directory(arg: str, root: str) -> bool:
    """Whether ``arg`` names ``root`` or a path below it (alone, or after ``=``, ``,``, ``:``)."""
    pattern = r"(?:^|[=,:])" + re.escape(root.rstrip("/")) + r"(?:/|$|[,:])"
    return re.search(pattern, arg) is not None


def component_of(argv: Sequence[str], root: str) -> str | None:
    """The cluster component this command line runs for ``root``, or None."""
    if not argv or not any(names_directory(arg, root) for arg in argv[1:]):
        return None
    for position, arg in enumerate(argv[:2]):
        name = os.path.basename(arg)
        if name == "gpushare" and position + 1 < len(argv):
            command = argv[position + 1]
            return f"gpushare-{command}" if command in GPUSHARE_COMMANDS else None
        if name in BINARIES:
            return name
    return None


def stop_order(found: Iterable[Found]) -> list[Found]:
    """Clients first (``BINARIES``' order), newest first within one component."""
    return sorted(found, key=lambda f: (BINARIES.index(f.component), -f.pid))


def read_argv(pid: int, proc: Path = Path("/proc")) -> list[str]:
    """A process's command line; empty when it is gone, a zombie or not readable."""
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def find_running(root: Path, proc: Path = Path("/proc")) -> list[Found]:
    """Every live process of the cluster in ``root``, in the order to stop them."""
    roots = {str(root.absolute()), str(root.resolve())}
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        argv = read_argv(int(entry.name), proc)
        for candidate in roots:
            component = component_of(argv, candidate)
            if component is not None:
                found.append(Found(int(entry.name), component))
                break
    return stop_order(found)


def _gone(pid: int) -> bool:
    # a child of this process stays a zombie until reaped: reap it if it is ours
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return not read_argv(pid)


def _signal(pid: int, sig: int) -> None:
    """Signal the process's group when it leads one (its children go too), else the process."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def stop(process: Found, grace_s: float = 5.0) -> bool:
    """SIGTERM, then SIGKILL after ``grace_s``; whether it is gone afterwards."""
    _signal(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if _gone(process.pid):
            return True
        time.sleep(0.1)
    _signal(process.pid, signal.SIGKILL)
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        if _gone(process.pid):
            return True
        time.sleep(0.1)
    return False
