"""Small helpers the integration tests share: a free loopback port and one
wire-protocol request over a ZeroMQ DEALER socket (proto/PROTOCOL.md)."""
import socket
import time

import msgpack


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wire_request(sock, id_, type_, timeout=300, **fields):
    """Sends one request frame with id_ on sock (a connected DEALER) and
    returns its frames up to and including its done or error frame; frames
    of other ids are skipped. TimeoutError when it does not end in time."""
    sock.send(msgpack.packb({"v": 1, "id": id_, "type": type_, **fields}))
    frames = []
    end = time.time() + timeout
    while time.time() < end:
        if not sock.poll(int(max(0.1, end - time.time()) * 1000)):
            break
        f = msgpack.unpackb(sock.recv(), raw=False)
        if f.get("id") != id_:
            continue
        frames.append(f)
        if f["type"] in ("done", "error"):
            return frames
    raise TimeoutError(f"{type_} {id_} did not finish")
