"""Which processes belong to a loopback cluster's directory, and in what order they stop."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.reaping import Found, component_of, find_running, names_directory, stop_order

ROOT = "/tmp/c"
BIN = "/root/.cache/gpushare/bin/kubernetes-v1.36.3"
VENV = "/work/repo/.venv/bin"


@pytest.mark.parametrize(
    ("arg", "named"),
    [
        ("/tmp/c", True),
        ("/tmp/c/", True),
        ("/tmp/c/etcd", True),
        ("--kubeconfig=/tmp/c/admin.kubeconfig", True),
        ("--etcd-servers=http://x,/tmp/c/pki/ca.crt", True),
        ("/tmp/c2/etcd", False),  # a sibling directory
        ("--data-dir=/tmp/c2", False),
        ("/var/tmp/c/etcd", False),  # the same name elsewhere
        ("CLUSTER_DIR=/tmp/cluster", False),
    ],
)
def test_names_directory(arg: str, named: bool) -> None:
    assert names_directory(arg, ROOT) is named


@pytest.mark.parametrize(
    ("argv", "component"),
    [
        (["/bin/etcd-v3.6.16/etcd", "--name", "e2e", "--data-dir", "/tmp/c/etcd"], "etcd"),
        ([f"{BIN}/kube-apiserver", "--tls-cert-file=/tmp/c/pki/apiserver.crt"], "kube-apiserver"),
        ([f"{BIN}/kube-scheduler", "--config=/tmp/c/scheduler-config.yaml"], "kube-scheduler"),
        (["/bin/kwok", "--kubeconfig=/tmp/c/admin.kubeconfig"], "kwok"),
        (
            [f"{VENV}/python", f"{VENV}/gpushare", "extender", "--kubeconfig", "/tmp/c/a"],
            "gpushare-extender",
        ),
        (
            [f"{VENV}/python", f"{VENV}/gpushare", "device-plugin", "--state-dir", "/tmp/c/rn/s"],
            "gpushare-device-plugin",
        ),
        (["containerd", "--config", "/tmp/c/realnode/containerd.toml"], "containerd"),
        (
            ["/usr/bin/containerd-shim-runc-v2", "-namespace", "k8s.io", "-address", "/tmp/c/s"],
            "containerd-shim-runc-v2",
        ),
        ([f"{BIN}/kubelet", "--root-dir=/tmp/c/realnode/kubelet"], "kubelet"),
        (
            ["/c/cluster-autoscaler-1.36.1/cluster-autoscaler", "--kubeconfig=/tmp/c/admin.kc"],
            "cluster-autoscaler",
        ),
        (
            [
                "/c/karpenter-kwok-v1.15.0/karpenter-kwok",
                "--instance-types-file-path=/tmp/c/k.json",
            ],
            "karpenter-kwok",
        ),
    ],
)
def test_components_of_the_directory(argv: list[str], component: str) -> None:
    assert component_of(argv, ROOT) == component
    assert component_of(argv, "/tmp/other") is None


@pytest.mark.parametrize(
    "argv",
    [
        [f"{VENV}/python", "-m", "harness.clusterctl", "down", "--dir", "/tmp/c"],  # ourselves
        ["make", "cluster-down", "CLUSTER_DIR=/tmp/c"],
        ["tail", "-f", "/tmp/c/logs/etcd.log"],  # only reading a log
        [f"{VENV}/python", f"{VENV}/gpushare", "simulate", "--out", "/tmp/c/report"],
        [f"{BIN}/kube-apiserver", "--cert-dir=/tmp/c2/certs"],  # another cluster's
        [f"{BIN}/etcd"],
        [],
    ],
)
def test_other_processes_do_not_belong(argv: list[str]) -> None:
    assert component_of(argv, ROOT) is None


def test_clients_stop_before_their_servers_newest_first() -> None:
    found = [
        Found(10, "etcd"),
        Found(11, "kube-apiserver"),
        Found(14, "gpushare-extender"),
        Found(15, "kube-scheduler"),
        Found(16, "kwok"),
        Found(30, "containerd-shim-runc-v2"),
        Found(31, "containerd-shim-runc-v2"),
        Found(20, "containerd"),
        Found(21, "kubelet"),
        Found(22, "gpushare-device-plugin"),
    ]
    assert [(f.component, f.pid) for f in stop_order(found)] == [
        ("gpushare-device-plugin", 22),
        ("kubelet", 21),
        ("containerd-shim-runc-v2", 31),
        ("containerd-shim-runc-v2", 30),
        ("containerd", 20),
        ("kwok", 16),
        ("kube-scheduler", 15),
        ("gpushare-extender", 14),
        ("kube-apiserver", 11),
        ("etcd", 10),
    ]


def fake_proc(tmp_path: Path, processes: dict[int, list[str]]) -> Path:
    proc = tmp_path / "proc"
    for pid, argv in processes.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in argv))
    (proc / "self").mkdir()  # not a pid
    return proc


def test_find_running_reads_command_lines(tmp_path: Path) -> None:
    root = tmp_path / "cluster"
    proc = fake_proc(
        tmp_path,
        {
            100: [f"{BIN}/etcd", "--data-dir", f"{root}/etcd"],
            101: [f"{BIN}/kube-apiserver", f"--cert-dir={root}/apiserver-certs"],
            102: [f"{BIN}/kube-apiserver", f"--cert-dir={root}2/apiserver-certs"],
            103: [],  # a zombie: no command line
            104: ["tail", "-f", f"{root}/logs/etcd.log"],
            os.getpid(): [f"{BIN}/etcd", "--data-dir", f"{root}/etcd"],  # never itself
        },
    )
    assert find_running(root, proc) == [Found(101, "kube-apiserver"), Found(100, "etcd")]
    assert find_running(tmp_path / "nothing", proc) == []


def test_find_running_matches_a_directory_given_through_a_symlink(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    proc = fake_proc(tmp_path, {200: [f"{BIN}/kwok", f"--kubeconfig={real}/admin.kubeconfig"]})
    assert find_running(link, proc) == [Found(200, "kwok")]
