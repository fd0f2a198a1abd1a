#!/usr/bin/env python3
"""Added latency of the remote route (issue 16): a streamed chat sent to an
OpenAI-compatible upstream directly (baseline) and through a routing
`rlai serve` whose config names that upstream, in the same run.

The upstream is a small stamping server started by this script: for each
request it streams N chunks whose content is the CLOCK_MONOTONIC time (ns)
at which it wrote them, GAP_MS apart. The client (http.client, the same
code for both paths) records:
  TTFT      request sent -> first content chunk read
  per token chunk read time - the chunk's stamp (the upstream and the client
            share the machine's monotonic clock), i.e. how long a token
            takes from the upstream's write to the client
Added latency = routed - direct (medians). Optionally (--real) the same
TTFT comparison against a second, real `rlai serve` as the upstream.

A third path, "relay floor", sends the same requests through
bench/relay_floor (a byte-copying TCP relay, built with the tree): what any
proxy adds on this machine (one more loopback hop and thread wake-up).

usage: bench/bench_remote.py [--rlai build/host/rlai] [--model models/...gguf]
                             [--requests 30] [--tokens 64] [--gap-ms 2] [--real]"""
import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def stamp_upstream(port, n_tokens, gap_ms):
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Connection", "close")
            self.end_headers()

            def chunk(b):
                # HTTP/1.1 chunked framing, as vLLM and SGLang (uvicorn) and
                # llama-server stream: every path's client decodes the same
                self.wfile.write(b"%X\r\n%s\r\n" % (len(b), b))
                self.wfile.flush()

            for i in range(n_tokens):
                if i:
                    time.sleep(gap_ms / 1000)
                c = {"choices": [{"index": 0, "delta": {"content": "%d;" % time.monotonic_ns()},
                                  "finish_reason": None}]}
                chunk(b"data: " + json.dumps(c).encode() + b"\n\n")
            fin = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
            chunk(b"data: " + json.dumps(fin).encode() + b"\n\ndata: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    srv = ThreadingHTTPServer(("127.0.0.1", port), H)
    print("ready", flush=True)
    srv.serve_forever()


def one_stream(port, model, headers=None, max_tokens=None):
    """Returns (ttft_s, [per-token latency s], text)."""
    body = {"model": model, "messages": [{"role": "user", "content": "Name three planets."}], "stream": True,
            "temperature": 0}
    if max_tokens:
        body["max_tokens"] = max_tokens
    data = json.dumps(body).encode()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    hdrs = dict({"Content-Type": "application/json"}, **(headers or {}))
    t0 = time.monotonic_ns()
    c.request("POST", "/v1/chat/completions", body=data, headers=hdrs)
    r = c.getresponse()
    assert r.status == 200, r.read()
    ttft, lat, text = None, [], ""
    while True:
        line = r.readline()
        if not line:
            break
        now = time.monotonic_ns()
        if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
            continue
        ev = json.loads(line[6:])
        ch = ev.get("choices") or []
        piece = ch[0].get("delta", {}).get("content") if ch else None
        if not piece:
            continue
        if ttft is None:
            ttft = (now - t0) / 1e9
        text += piece
        for s in piece.split(";"):
            if s.isdigit():
                lat.append((now - int(s)) / 1e9)
    c.close()
    return ttft, lat, text


def wait_http(port, proc, what):
    end = time.time() + 600
    while time.time() < end:
        if proc.poll() is not None:
            raise SystemExit(what + " exited")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(what + " did not come up")


def serve(rlai, model, tmp, name, extra):
    d = Path(tmp) / name
    (d / "rt").mkdir(parents=True, mode=0o700)
    port = free_port()
    env = dict(os.environ, XDG_RUNTIME_DIR=str(d / "rt"), XDG_CONFIG_HOME=str(d / "cfg"))
    env.pop("RLAI_API_KEY", None)
    p = subprocess.Popen([rlai, "serve", "-m", model, "-t", "1", "-c", "1024", "--http", f"127.0.0.1:{port}",
                          "--no-plugins", "--no-auth", *extra], env=env,
                         stdout=subprocess.DEVNULL, stderr=open(d / "serve.log", "wb"))
    wait_http(port, p, name)
    return p, port


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def p90(xs):
    return sorted(xs)[int(0.9 * (len(xs) - 1))] if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlai", default=str(ROOT / "build" / "host" / "rlai"))
    ap.add_argument("--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--requests", type=int, default=30)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--gap-ms", type=float, default=2.0)
    ap.add_argument("--real", action="store_true", help="also TTFT against a real rlai serve upstream")
    ap.add_argument("--upstream", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.upstream:
        return stamp_upstream(a.upstream, a.tokens, a.gap_ms)
    procs = []
    try:
        sp = free_port()
        st = subprocess.Popen([sys.executable, __file__, "--upstream", str(sp), "--tokens", str(a.tokens),
                               "--gap-ms", str(a.gap_ms)], stdout=subprocess.PIPE)
        procs.append(st)
        assert st.stdout.readline().strip() == b"ready"
        tmp = tempfile.mkdtemp(prefix="bench-remote-")
        ups = [{"name": "stamp", "base_url": f"http://127.0.0.1:{sp}/v1", "models": {"stamp": "stamp"}}]
        real_port = None
        if a.real:
            rp, real_port = serve(a.rlai, a.model, tmp, "upstream", [])
            procs.append(rp)
            ups.append({"name": "real", "base_url": f"http://127.0.0.1:{real_port}/v1",
                        "models": {"real": "default"}})
        conf = Path(tmp) / "router.json"
        conf.write_text(json.dumps({"upstreams": ups}))
        router, rport = serve(a.rlai, a.model, tmp, "router", ["--config", str(conf)])
        procs.append(router)
        # the floor: the same upstream through a byte-copying TCP relay
        relay_bin = Path(a.rlai).resolve().parents[1] / "bench" / "relay_floor"
        fport = None
        if relay_bin.exists():
            fport = free_port()
            rl = subprocess.Popen([str(relay_bin), str(fport), str(sp)], stdout=subprocess.PIPE)
            procs.append(rl)
            assert rl.stdout.readline().strip() == b"ready"
        # warm up both paths (connections, caches)
        paths = [("direct", sp), ("routed", rport)] + ([("relay floor", fport)] if fport else [])
        for _ in range(3):
            for _, port in paths:
                one_stream(port, "stamp")
        res = {kind: ([], []) for kind, _ in paths}
        for _ in range(a.requests):
            for kind, port in paths:
                ttft, lat, _ = one_stream(port, "stamp")
                res[kind][0].append(ttft)
                res[kind][1].extend(lat)
        print(f"remote route vs direct upstream: {a.requests} streamed chats x {a.tokens} tokens, "
              f"{a.gap_ms} ms apart (stamping upstream)")
        print("| path | TTFT median (ms) | TTFT p90 (ms) | token latency median (us) | token latency p90 (us) |")
        print("|---|---|---|---|---|")
        for kind, _ in paths:
            t, l = res[kind]
            print(f"| {kind} | {med(t) * 1e3:.3f} | {p90(t) * 1e3:.3f} | {med(l) * 1e6:.1f} | {p90(l) * 1e6:.1f} |")
        dt = (med(res["routed"][0]) - med(res["direct"][0])) * 1e3
        dl = (med(res["routed"][1]) - med(res["direct"][1])) * 1e6
        print(f"| **added by the route** | **{dt:.3f}** | | **{dl:.1f}** | |")
        if fport:
            ft = (med(res["relay floor"][0]) - med(res["direct"][0])) * 1e3
            fl = (med(res["relay floor"][1]) - med(res["direct"][1])) * 1e6
            print(f"| added by the relay floor | {ft:.3f} | | {fl:.1f} | |")
        print(f"targets: < 1 ms TTFT ({'met' if dt < 1 else 'NOT met'}), < 50 us per token "
              f"({'met' if dl < 50 else 'NOT met'})")
        if real_port:
            tt = {"direct": [], "routed": []}
            for _ in range(3):
                one_stream(real_port, "default", max_tokens=4)
                one_stream(rport, "real", max_tokens=4)
            for _ in range(max(5, a.requests // 3)):
                tt["direct"].append(one_stream(real_port, "default", max_tokens=4)[0])
                tt["routed"].append(one_stream(rport, "real", max_tokens=4)[0])
            print()
            print("real `rlai serve` upstream (greedy chat, 4 tokens): TTFT median (ms)")
            print("| direct | routed | added |")
            print("|---|---|---|")
            print(f"| {med(tt['direct']) * 1e3:.2f} | {med(tt['routed']) * 1e3:.2f} | "
                  f"{(med(tt['routed']) - med(tt['direct'])) * 1e3:.2f} |")
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    main()
