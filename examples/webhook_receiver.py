"""A webhook receiver for trying stepwise: verifies each event's signature and prints it.

    STEPWISE_WEBHOOK_SECRET=whsec_... python examples/webhook_receiver.py --port 9000

Standalone on purpose (stdlib only): it is what your own receiver needs to do.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import json
import os
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def verify(secret: str, headers, body: bytes) -> bool:
    key = base64.b64decode(secret.removeprefix("whsec_")) if secret.startswith("whsec_") else secret.encode()
    msg_id, timestamp = headers["webhook-id"], headers["webhook-timestamp"]
    signed = f"{msg_id}.{timestamp}.".encode() + body
    expected = "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    fresh = abs(time.time() - int(timestamp)) < 300
    return fresh and any(hmac.compare_digest(expected, s) for s in headers["webhook-signature"].split())


class Receiver(BaseHTTPRequestHandler):
    secret = ""

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:
            ok = verify(self.secret, self.headers, body)
        except (KeyError, ValueError):
            ok = False
        event = json.loads(body or b"{}")
        print(
            f"{'verified' if ok else 'BAD SIGNATURE'} {self.headers.get('webhook-id')} "
            f"{event.get('type')} {json.dumps(event.get('data'))}",
            flush=True,
        )
        self.send_response(204 if ok else 401)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=9000)
    args = parser.parse_args()
    Receiver.secret = os.environ.get("STEPWISE_WEBHOOK_SECRET", "")
    if not Receiver.secret:
        parser.error("set STEPWISE_WEBHOOK_SECRET to the secret the worker signs with")
    print(f"listening on http://127.0.0.1:{args.port}/", flush=True)
    ThreadingHTTPServer(("127.0.0.1", args.port), Receiver).serve_forever()


if __name__ == "__main__":
    main()
