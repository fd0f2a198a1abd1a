"""A small misbehaving OpenAI-compatible upstream for tests/integration/test_remote.py.

`python3 bad_upstream.py PORT [CERT KEY]` serves POST /v1/chat/completions
and /v1/completions, over TLS with CERT and KEY when given; the "model"
field of the request chooses the behaviour:

  ok         streams "Hello", " from", " bad", " upstream" then [DONE]
  500once    HTTP 500 on the first attempt of each distinct request body
             (the messages/prompt), then like ok
  500        always HTTP 500          429   always HTTP 429
  400        always HTTP 400 with an OpenAI error object
  malformed  HTTP 200, then an event whose data is not JSON
  slow       waits 30 s before the first byte of the body
  stall      one token, then silence for 30 s
  short      one token, then the connection closes without [DONE]
  echo       streams back, as its text, the JSON of the request's "messages"
             and "tools" (what an upstream was given), in 3 pieces
  burst      BURST events "0".."9" repeating, written at once (many TLS
             records in one read), then [DONE]

GET /stats answers {"hits": {model: n}, "disconnects": n} (a client that
hung up while we were writing or waiting counts as a disconnect)."""
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()
HITS = {}
SEEN = set()
DISCONNECTS = [0]

WORDS = ["Hello", " from", " bad", " upstream"]
BURST = 3000


def chunk(chat, text=None, finish=None):
    if chat:
        delta = {"content": text} if text is not None else {}
        c = {"index": 0, "delta": delta, "finish_reason": finish}
        obj = "chat.completion.chunk"
    else:
        c = {"index": 0, "text": text or "", "finish_reason": finish}
        obj = "text_completion"
    return ("data: " + json.dumps({"id": "x", "object": obj, "choices": [c]}) + "\n\n").encode()


class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        with LOCK:
            body = json.dumps({"hits": HITS, "disconnects": DISCONNECTS[0]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def plain(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def start_stream(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

    def wait_or_disconnect(self, seconds):
        """Sleeps, noticing a client that hangs up (counted)."""
        import select
        end = time.time() + seconds
        while time.time() < end:
            r, _, _ = select.select([self.connection], [], [], 0.05)
            if r:
                try:
                    if not self.connection.recv(1, 0x40):   # MSG_DONTWAIT
                        with LOCK:
                            DISCONNECTS[0] += 1
                        return False
                except BlockingIOError:
                    pass
                except OSError:
                    with LOCK:
                        DISCONNECTS[0] += 1
                    return False
        return True

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        req = json.loads(self.rfile.read(n) or b"{}")
        model = req.get("model", "")
        chat = self.path.endswith("/chat/completions")
        key = json.dumps(req.get("messages") or req.get("prompt"))
        with LOCK:
            HITS[model] = HITS.get(model, 0) + 1
        if model == "500once":
            with LOCK:
                first = key not in SEEN
                SEEN.add(key)
            if first:
                return self.plain(500, {"error": {"message": "transient failure", "type": "server_error"}})
            model = "ok"
        if model == "500":
            return self.plain(500, {"error": {"message": "upstream is broken", "type": "server_error"}})
        if model == "429":
            return self.plain(429, {"error": {"message": "slow down", "type": "rate_limit"}})
        if model == "400":
            return self.plain(400, {"error": {"message": "bad parameter 'x'", "type": "invalid_request_error"}})
        if model == "slow":
            self.wait_or_disconnect(30)
            return
        self.start_stream()
        try:
            if model == "malformed":
                self.wfile.write(b"data: {this is not json\n\n")
                self.wfile.flush()
                return
            if model == "echo":
                t = json.dumps({"messages": req.get("messages"), "tools": req.get("tools")})
                for i in range(3):
                    self.wfile.write(chunk(chat, t[i * len(t) // 3:(i + 1) * len(t) // 3]))
            if model == "burst":
                self.wfile.write(b"".join(chunk(chat, str(i % 10)) for i in range(BURST)))
            words = [] if model in ("burst", "echo") else WORDS[:1] if model in ("stall", "short") else WORDS
            for w in words:
                self.wfile.write(chunk(chat, w))
                self.wfile.flush()
            if model == "stall":
                self.wait_or_disconnect(30)
                return
            if model == "short":
                return
            self.wfile.write(chunk(chat, None, "stop"))
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            with LOCK:
                DISCONNECTS[0] += 1


def main():
    port = int(sys.argv[1])
    srv = ThreadingHTTPServer(("127.0.0.1", port), H)
    srv.daemon_threads = True
    if len(sys.argv) > 3:
        import ssl
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(sys.argv[2], sys.argv[3])
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    print("ready", flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
