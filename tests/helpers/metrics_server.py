"""A server's /metrics for tests: each GET answers what `render()` returns at that moment, so a
test decides how its counters move between the scrapes a sweep takes around a point."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def serve_metrics(render: Callable[[], str], port: int = 0) -> ThreadingHTTPServer:
    """Serve render()'s text on 127.0.0.1:port (0: any free port) from a daemon thread; calls to
    render() never overlap. The caller shuts the server down (shutdown(), server_close())."""
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            with lock:
                body = render().encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
