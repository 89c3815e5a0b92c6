"""What one watched pod costs the extender to decode: lightkube's models against plain JSON.

Every pod event of the extender's watch is decoded once. Before, lightkube built its model of
the whole pod (a struct per field, ``managedFields`` included) and the cache took it apart
again into a dict (``to_dict``); now lightkube hands over the server's JSON as a dict and
``kube.lightkube_api._slim`` drops what no reader reads. Both ways run here on the same bytes,
in the same process, and the ratio is printed (this machine is noisy; the ratio is what
compares across runs).

The pod is one of the staged benchmark's GPU pods as kube-apiserver returns it once bound by
gpushare: defaults filled in, the service-account volume, two managers' ``managedFields``, a
sealed allocation.

    python benchmarks/watch_decode.py [--events 20000]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from lightkube.core import decoders
from lightkube.resources.core_v1 import Pod

from gpushare.core.model.requests import PodRequest, read_pod
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.allocation import plan
from gpushare.core.records.trust import SealKey, Trust
from gpushare.kube.lightkube_api import _PodJSON, _slim
from gpushare.kube.objects import gpu_pod, placed


def api_pod() -> dict[str, Any]:
    """A bound GPU pod as the API server shows it."""
    obj = gpu_pod("g00042", mem=4, namespace="tp-gpu")
    obj["metadata"].update(
        uid="6d1c7a52-4f0e-4a57-9f39-3c2f1b0e9a11",
        resourceVersion="123456",
        creationTimestamp="2026-11-26T18:00:00Z",
        labels={"app": "e2e"},
    )
    request = read_pod(obj)
    assert isinstance(request, PodRequest)
    allocation = plan(request, node="tp-00042", indexes=[3], unit=MemoryUnit.GiB)
    pod = placed(obj, allocation, trust=Trust.sealed(SealKey(b"k" * 32)))
    pod["metadata"]["managedFields"] = [
        {
            "manager": "kubectl-create",
            "operation": "Update",
            "apiVersion": "v1",
            "time": "2026-11-26T18:00:00Z",
            "fieldsType": "FieldsV1",
            "fieldsV1": {
                "f:metadata": {"f:labels": {".": {}, "f:app": {}}},
                "f:spec": {
                    "f:containers": {
                        'k:{"name":"main"}': {
                            ".": {},
                            "f:image": {},
                            "f:imagePullPolicy": {},
                            "f:name": {},
                            "f:resources": {"f:limits": {".": {}, "f:aliyun.com/gpu-mem": {}}},
                            "f:terminationMessagePath": {},
                            "f:terminationMessagePolicy": {},
                        }
                    },
                    "f:dnsPolicy": {},
                    "f:enableServiceLinks": {},
                    "f:nodeSelector": {},
                    "f:restartPolicy": {},
                    "f:schedulerName": {},
                    "f:securityContext": {},
                    "f:terminationGracePeriodSeconds": {},
                },
            },
        },
        {
            "manager": "gpushare",
            "operation": "Update",
            "apiVersion": "v1",
            "time": "2026-11-26T18:00:01Z",
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:annotations": {".": {}}}},
        },
    ]
    pod["spec"].update(
        restartPolicy="Always",
        terminationGracePeriodSeconds=30,
        dnsPolicy="ClusterFirst",
        serviceAccountName="default",
        serviceAccount="default",
        securityContext={},
        enableServiceLinks=True,
        preemptionPolicy="PreemptLowerPriority",
        priority=0,
        nodeSelector={"gpushare-e2e": "throughput"},
        tolerations=[
            {
                "key": f"node.kubernetes.io/{what}",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            }
            for what in ("not-ready", "unreachable")
        ],
        volumes=[
            {
                "name": "kube-api-access-x7k2p",
                "projected": {
                    "defaultMode": 420,
                    "sources": [
                        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                        {
                            "configMap": {
                                "name": "kube-root-ca.crt",
                                "items": [{"key": "ca.crt", "path": "ca.crt"}],
                            }
                        },
                        {
                            "downwardAPI": {
                                "items": [
                                    {
                                        "path": "namespace",
                                        "fieldRef": {
                                            "apiVersion": "v1",
                                            "fieldPath": "metadata.namespace",
                                        },
                                    }
                                ]
                            }
                        },
                    ],
                },
            }
        ],
    )
    pod["spec"]["containers"][0].update(
        terminationMessagePath="/dev/termination-log",
        terminationMessagePolicy="File",
        imagePullPolicy="Always",
        volumeMounts=[
            {
                "name": "kube-api-access-x7k2p",
                "readOnly": True,
                "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
            }
        ],
    )
    pod["status"] = {
        "phase": "Pending",
        "qosClass": "BestEffort",
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-11-26T18:00:01Z"}
        ],
    }
    return pod


def per_event_us(decode: Callable[[bytes], object], raw: bytes, events: int) -> float:
    """Microseconds per decode, the best of three rounds."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(events):
            decode(raw)
        best = min(best, (time.perf_counter() - start) / events * 1e6)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=20000)
    args = parser.parse_args(argv)
    if args.events < 1:
        parser.error(f"--events {args.events} is too small: give at least 1")
    raw = json.dumps(api_pod()).encode()
    model = per_event_us(lambda b: decoders.decode_object(b, Pod).to_dict(), raw, args.events)
    plain = per_event_us(
        lambda b: _slim(decoders.decode_object(b, _PodJSON), "Pod"), raw, args.events
    )
    kept = len(json.dumps(_slim(decoders.decode_object(raw, _PodJSON), "Pod")))
    print(f"pod event: {len(raw)} bytes, {kept} kept after _slim")
    print(f"lightkube model + to_dict: {model:.1f} us per event")
    print(f"JSON + _slim:              {plain:.1f} us per event ({plain / model:.2f} of the model)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
