#!/usr/bin/env python3
"""squatter.py - the port squatter of issue 31: an unprivileged process that
binds a daemon's port first and answers its clients (fake /health, /metrics,
completions), writing every Authorization header it is sent to a file.

    squatter.py HOST PORT STATUSFILE KEYSFILE

PORT 0 takes an ephemeral one.  STATUSFILE gets "bound PORT" once listening,
or "refused ERRNO-NAME" when the bind fails (then it exits 3)."""
import errno
import http.server
import socket
import sys

host, port, status_path, keys_path = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]


class Fake(http.server.BaseHTTPRequestHandler):
    def _answer(self):
        auth = self.headers.get("Authorization")
        if auth:
            with open(keys_path, "a") as f:
                f.write(auth + "\n")
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            self.rfile.read(n)
        body = b'ok\n' if self.path == "/health" else b'DCGM_FI_DEV_GPU_TEMP{gpu="0"} 30\n'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *a):
        pass


class Server(http.server.HTTPServer):
    allow_reuse_address = True


try:
    srv = Server((host, port), Fake)
except OSError as e:
    with open(status_path, "w") as f:
        f.write("refused %s\n" % errno.errorcode.get(e.errno, str(e.errno)))
    sys.exit(3)
with open(status_path, "w") as f:
    f.write("bound %d\n" % srv.server_address[1])
srv.serve_forever()
