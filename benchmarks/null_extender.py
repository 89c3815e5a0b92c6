"""A reference extender that decides nothing: the floor any Python extender stands on.

It speaks the same wire format as ``gpushare extender``, over the same server (uvicorn with
uvloop and httptools, ``server_config``) and binds through the same client
(``LightkubeAPI.bind_pod``), but keeps no cache, reads no pod and books nothing:

- filter answers with the first node kube-scheduler sent, so kube-scheduler scores nothing
  and calls no prioritize, as with gpushare's one-node answer;
- bind POSTs the ``pods/binding`` and answers.

``benchmarks/throughput.py --extender null`` serves it on the extender's port in place of
gpushare. The gap between its GPU rate and gpushare's is what gpushare's decisions cost; the
gap between its rate and the plain pods' is the round trip itself on the same machine. It
over-commits GPUs (only kube-scheduler's count of the node's total ``aliyun.com/gpu-mem``
holds it back), so its packing numbers mean nothing.

    python benchmarks/null_extender.py --kubeconfig K --port P
"""

from __future__ import annotations

import argparse
from typing import Any

import msgspec
import uvicorn
from starlette.types import Receive, Scope, Send

from gpushare.extender.app import server_config
from gpushare.extender.wire import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
)
from gpushare.kube.lightkube_api import LightkubeAPI
from gpushare.kube.port import KubeAPI, KubeError

_HEADERS = [(b"content-type", b"application/json")]


class NullExtender:
    """The raw ASGI app: filter and bind, plus the probes and an empty /metrics."""

    def __init__(self, api: KubeAPI) -> None:
        self.api = api

    async def _body(self, receive: Receive) -> bytes:
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _filter(self, body: bytes) -> bytes:
        args = msgspec.json.decode(body, type=ExtenderArgs)
        names = args.NodeNames or []
        return msgspec.json.encode(ExtenderFilterResult(NodeNames=names[:1]))

    async def _bind(self, body: bytes) -> bytes:
        args = msgspec.json.decode(body, type=ExtenderBindingArgs)
        try:
            await self.api.bind_pod(args.PodNamespace, args.PodName, args.PodUID, args.Node)
        except KubeError as err:
            return msgspec.json.encode(ExtenderBindingResult(Error=str(err)))
        return msgspec.json.encode(ExtenderBindingResult())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        status, body = 200, b"ok"
        if scope["method"] == "POST" and path == "/filter":
            body = await self._filter(await self._body(receive))
        elif scope["method"] == "POST" and path == "/bind":
            body = await self._bind(await self._body(receive))
        elif path == "/metrics":
            body = b""
        elif path not in ("/readyz", "/healthz"):
            status, body = 404, b"not found"
        await send({"type": "http.response.start", "status": status, "headers": _HEADERS})
        await send({"type": "http.response.body", "body": body})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--port", type=int, required=True)
    options = parser.parse_args(argv)
    app: Any = NullExtender(LightkubeAPI.connect(options.kubeconfig))
    config = server_config(app, host="127.0.0.1", port=options.port, log_level="warning")
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
