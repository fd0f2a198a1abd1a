"""Transports: ZeroMQ (DEALER to the engine's ROUTER) and the named pipe
(Unix domain stream socket, 4-byte big-endian length + payload).

A transport moves whole protocol messages (bytes). It is not thread-safe;
the client serialises access to it.
"""
from __future__ import annotations

import errno
import os
import select
import socket
import struct
from typing import List, Optional

import zmq
from zmq.utils.monitor import parse_monitor_message

from .errors import AuthenticationFailed, EngineDisconnected, EngineNotRunning, ProtocolError
from .protocol import MAX_FRAME

__all__ = ["Transport", "ZmqTransport", "UnixTransport", "open_transport"]

# Same values as ipc/client.c: the engine pings every 500 ms and drops a
# peer silent for 1.5 s; the client does the same towards the engine.
HEARTBEAT_IVL_MS = 500
#: ZeroMQ PLAIN username of the engine's tcp:// endpoints (the password is the API key).
PLAIN_USER = b"rlai"
HEARTBEAT_TIMEOUT_MS = 1500
HEARTBEAT_TTL_MS = 1500


class Transport:
    """Interface of a transport."""

    endpoint: str
    dead: bool = False

    def send(self, data: bytes) -> None:
        """Sends one message; raises EngineDisconnected when the engine is gone."""
        raise NotImplementedError

    def recv(self, timeout: float) -> List[bytes]:
        """Returns the messages that arrived, waiting up to ``timeout``
        seconds (0 = poll) for the first. Returns messages received before
        the engine went away first; raises EngineDisconnected (or
        EngineNotRunning while nothing was ever connected) when there are
        none and the connection is gone."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class ZmqTransport(Transport):
    """A DEALER socket with heartbeats and a connection monitor: a
    DISCONNECTED event (the engine exited or stopped answering heartbeats)
    marks the transport dead, a failed first connection attempt marks it
    refused."""

    _EVENTS = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED
               | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
               | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH)

    def __init__(self, endpoint: str, api_key: Optional[str] = None) -> None:
        self.endpoint = endpoint
        self.connected = False
        self.refused = False
        self.dead = False
        self.auth_failed = False
        self.mech_failed = False
        #: tcp:// only: ZeroMQ PLAIN credentials (username "rlai", password = the key).
        self.api_key = api_key if endpoint.startswith("tcp://") and api_key else None
        if endpoint.startswith("ipc://"):
            path = endpoint[6:]
            if not path.startswith("@") and not os.path.exists(path):
                raise EngineNotRunning(f"no engine at {endpoint} (is `rlai serve` running?)")
        self.ctx = zmq.Context()
        try:
            self.sock = self.ctx.socket(zmq.DEALER)
            self.sock.setsockopt(zmq.LINGER, 0)
            self.sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
            self.sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
            self.sock.setsockopt(zmq.HEARTBEAT_TTL, HEARTBEAT_TTL_MS)
            self.sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME)
            if endpoint.startswith("tcp://") and "[" in endpoint:
                self.sock.setsockopt(zmq.IPV6, 1)
            if self.api_key:
                self.sock.setsockopt(zmq.PLAIN_USERNAME, PLAIN_USER)
                self.sock.setsockopt(zmq.PLAIN_PASSWORD, self.api_key.encode())
            self.mon = self.sock.get_monitor_socket(self._EVENTS)
            self.sock.connect(endpoint)
        except zmq.ZMQError as e:
            self.close()
            raise ValueError(f"invalid endpoint {endpoint}: {e}") from None
        self.poller = zmq.Poller()
        self.poller.register(self.sock, zmq.POLLIN)
        self.poller.register(self.mon, zmq.POLLIN)

    def _drain_monitor(self) -> None:
        while True:
            try:
                parts = self.mon.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            except zmq.ZMQError:
                self.dead = True
                return
            try:
                event = parse_monitor_message(parts)["event"]
            except Exception:
                continue
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.connected = True
            elif event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                self.auth_failed = True
                self.dead = True
            elif event in (zmq.EVENT_DISCONNECTED, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
                           zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL):
                if not self.connected:
                    self.mech_failed = True
                self.dead = True
            elif event in (zmq.EVENT_CONNECT_RETRIED, zmq.EVENT_CLOSED):
                if self.connected:
                    self.dead = True
                else:
                    self.refused = True

    def _gone(self) -> Exception:
        if self.endpoint.startswith("tcp://") and self.auth_failed:
            return AuthenticationFailed(f"the engine at {self.endpoint} refused the API key (wrong key; "
                                        "see api_key= / RLAI_API_KEY and ~/.config/rlai/api_key)")
        if self.endpoint.startswith("tcp://") and self.mech_failed and not self.connected:
            if self.api_key:
                return AuthenticationFailed(f"the engine at {self.endpoint} does not take an API key on this "
                                            "endpoint (served with --no-auth?)")
            return AuthenticationFailed(f"the engine at {self.endpoint} requires an API key on this tcp:// "
                                        "endpoint (api_key= or RLAI_API_KEY; the key file is "
                                        "~/.config/rlai/api_key)")
        if self.refused and not self.connected:
            return EngineNotRunning(f"no engine answers at {self.endpoint} (is `rlai serve` running?)")
        return EngineDisconnected(f"the engine at {self.endpoint} went away")

    def _take(self) -> List[bytes]:
        out: List[bytes] = []
        while True:
            try:
                parts = self.sock.recv_multipart(zmq.NOBLOCK, copy=True)
            except zmq.Again:
                return out
            except zmq.ZMQError:
                self.dead = True
                return out
            # An empty first part is a delimiter (REQ-style); later parts ignored.
            payload = next((p for p in parts if len(p) > 0), None)
            if payload is not None:
                out.append(payload)

    def send(self, data: bytes) -> None:
        self._drain_monitor()
        if self.dead:
            raise self._gone()
        # A DEALER queues while not connected; the queue is large (HWM
        # 1000), so this only waits when the engine is not reading.
        while True:
            try:
                self.sock.send(data, zmq.NOBLOCK)
                return
            except zmq.Again:
                pass
            except zmq.ZMQError as e:
                self.dead = True
                raise EngineDisconnected(f"send to {self.endpoint} failed: {e}") from None
            self.poller.poll(100)
            self._drain_monitor()
            if self.dead:
                raise self._gone()

    def recv(self, timeout: float) -> List[bytes]:
        out = self._take()
        if out:
            return out
        self._drain_monitor()
        if self.dead or (self.refused and not self.connected):
            out = self._take()
            if out:
                return out
            raise self._gone()
        if timeout > 0:
            try:
                self.poller.poll(max(1, int(timeout * 1000)))
            except zmq.ZMQError as e:
                if e.errno != errno.EINTR:
                    self.dead = True
            out = self._take()
            self._drain_monitor()
            if not out and (self.dead or (self.refused and not self.connected)):
                raise self._gone()
        return out

    def close(self) -> None:
        sock = getattr(self, "sock", None)
        mon = getattr(self, "mon", None)
        if sock is not None and mon is not None:
            try:
                sock.disable_monitor()
            except zmq.ZMQError:
                pass
        for s in (mon, sock):
            if s is not None:
                s.close(linger=0)
        self.ctx.term()
        self.dead = True


class UnixTransport(Transport):
    """The named pipe: a Unix domain stream socket; every message is a
    4-byte big-endian length followed by the payload."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.dead = False
        path = endpoint[len("unix://"):] if endpoint.startswith("unix://") else endpoint
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.connect(path)
        except OSError as e:
            self.sock.close()
            if e.errno in (errno.ENOENT, errno.ECONNREFUSED, errno.ENOTSOCK, errno.ENOTDIR):
                raise EngineNotRunning(f"no engine at {endpoint} (is `rlai serve` running?)") from None
            raise EngineNotRunning(f"cannot connect to {endpoint}: {e}") from None
        self.sock.setblocking(False)
        self.buf = bytearray()

    def _parse(self) -> List[bytes]:
        out: List[bytes] = []
        while len(self.buf) >= 4:
            (n,) = struct.unpack(">I", self.buf[:4])
            if n == 0 or n > MAX_FRAME:
                self.dead = True
                raise ProtocolError(f"framing error from the engine (length {n})")
            if len(self.buf) < 4 + n:
                break
            out.append(bytes(self.buf[4:4 + n]))
            del self.buf[:4 + n]
        return out

    def _read(self, timeout: float) -> List[bytes]:
        if self.dead:
            return []
        r, _, _ = select.select([self.sock], [], [], max(0.0, timeout))
        if not r:
            return []
        while True:
            try:
                chunk = self.sock.recv(1 << 16)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self.dead = True
                break
            if not chunk:
                self.dead = True
                break
            self.buf += chunk
            if len(chunk) < (1 << 16):
                break
        return self._parse()

    def send(self, data: bytes) -> None:
        if self.dead:
            raise EngineDisconnected(f"the engine at {self.endpoint} went away")
        view = memoryview(struct.pack(">I", len(data)) + data)
        while view:
            try:
                n = self.sock.send(view)
                view = view[n:]
            except (BlockingIOError, InterruptedError):
                # Wait for room; replies keep arriving in the kernel buffer
                # and are read by the next recv().
                select.select([], [self.sock], [], 1.0)
            except OSError as e:
                self.dead = True
                raise EngineDisconnected(f"send to {self.endpoint} failed: {e}") from None

    def recv(self, timeout: float) -> List[bytes]:
        out = self._parse()
        if not out:
            out = self._read(timeout)
        if not out and self.dead:
            raise EngineDisconnected(f"the engine at {self.endpoint} went away")
        return out

    def close(self) -> None:
        self.dead = True
        self.sock.close()


def open_transport(endpoint: str, api_key: Optional[str] = None) -> Transport:
    """Opens ``ipc://PATH`` / ``tcp://HOST:PORT`` (ZeroMQ) or ``unix://PATH``
    (named pipe). ``api_key`` is used on tcp:// only (ZeroMQ PLAIN)."""
    if endpoint.startswith("unix://"):
        return UnixTransport(endpoint)
    if endpoint.startswith(("ipc://", "tcp://")):
        return ZmqTransport(endpoint, api_key)
    raise ValueError(f"unsupported endpoint {endpoint!r} (use ipc://PATH, tcp://HOST:PORT or unix://PATH)")
