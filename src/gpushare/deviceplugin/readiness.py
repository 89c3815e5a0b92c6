"""The device plugin's ``/healthz`` and ``/readyz``, on 127.0.0.1 (``--health-port``).

Ready means the plugin does what it is there for: it registered with kubelet, its background
loops all run, and the API server answers its lists and watches (kube.watchhealth). A watch RBAC
refuses leaves the plugin serving Allocate from a store that stopped following its node, so no
pod is marked served and the hand-off rule holds later pods: the DaemonSet's readiness probe
then shows the pod not Ready with the reason, and a rolling update stops at the first node.

Served apart from ``/metrics`` and on the loopback only: the chart's probe runs inside the
container (``gpushare.execProbe``), so whatever guards the metrics port does not stand in its
way, and nothing off the node learns more than the metrics say. The reason is computed by the
plugin (``DevicePlugin.not_ready``); this module only answers HTTP, on a daemon thread.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread


def health_server(
    not_ready: Callable[[], str], *, port: int, host: str = "127.0.0.1"
) -> ThreadingHTTPServer:
    """A server answering ``/healthz`` (always 200) and ``/readyz`` (503 with the reason while
    ``not_ready`` says one); call ``serve_forever`` or use :func:`serve_health`."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/healthz":
                self._answer(200, b"ok")
            elif self.path == "/readyz":
                reason = not_ready()
                if reason:
                    body = json.dumps({"ready": False, "reason": reason}).encode()
                    self._answer(503, body, "application/json")
                else:
                    self._answer(200, b"ok")
            else:
                self._answer(404, b"not found: /healthz and /readyz are served here")

        def _answer(self, code: int, body: bytes, kind: str = "text/plain") -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            """Probes come every few seconds: not logged."""

    return ThreadingHTTPServer((host, port), Handler)


def serve_health(not_ready: Callable[[], str], *, port: int) -> ThreadingHTTPServer | None:
    """Serve them on a daemon thread; port 0 serves nothing."""
    if not port:
        return None
    server = health_server(not_ready, port=port)
    Thread(target=server.serve_forever, name="health", daemon=True).start()
    return server
