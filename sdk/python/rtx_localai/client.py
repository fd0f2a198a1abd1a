"""RTXLocalAIClient: the Python client of the RTX-LocalAI engine daemon.

Example::

    from rtx_localai import RTXLocalAIClient

    with RTXLocalAIClient() as ai:                 # default endpoint
        for piece in ai.stream_generate("Once upon a time", max_tokens=32):
            print(piece, end="", flush=True)
        g = ai.chat([{"role": "user", "content": "Hi!"}], max_tokens=32)
        print(g.text, g.stop, g.metrics.ttft_ms)
"""
from __future__ import annotations

import itertools
import os
import json
import threading
import time
import weakref
from collections import deque
from typing import Any, Deque, Dict, Iterable, Iterator, List, Optional, Union

from . import __version__
from .errors import (EngineConnectionError, EngineDisconnected, EngineNotRunning, NotFound, ProtocolError,
                     RequestTimeout, RTXLocalAIError, error_from_frame)
from .protocol import decode_frame, default_zmq_endpoint, encode_request
from .results import CallResult, Generation, Metrics
from .transport import Transport, open_transport

__all__ = ["RTXLocalAIClient", "Stream", "DEFAULT_TIMEOUT", "DEFAULT_CONNECT_TIMEOUT"]

DEFAULT_TIMEOUT = 300.0          # seconds to wait for the next frame of a request
DEFAULT_CONNECT_TIMEOUT = 5.0    # seconds for the connect-time hello round trip
_SLICE = 0.1                     # longest wait holding the I/O lock (lets other threads in)
_TERMINAL = ("done", "error")

_UNSET: Any = object()


class Stream(Iterator[str]):
    """The frames of one request in flight, as an iterator of text pieces.

    Iterating yields every non-empty ``token`` text as it arrives; it stops
    at the request's ``done`` frame and raises the request's error (an
    :class:`~rtx_localai.errors.RTXLocalAIError` subclass) at an ``error``
    frame. ``result`` frames are collected in :attr:`results`. After the end
    :attr:`stop`, :attr:`metrics` and :meth:`finish` give the outcome.

    A stream that is dropped before its end is cancelled by the client;
    ``with client.stream_generate(...) as s:`` or :meth:`close` do it at once.
    """

    def __init__(self, client: "RTXLocalAIClient", request_id: int, kind: str, timeout: Optional[float],
                 command: str = "") -> None:
        self.id: int = request_id            #: the request id
        self.kind: str = kind                #: generate, chat, call or the request type
        self.command: str = command          #: the command, for calls
        self.tokens: List[int] = []          #: token ids received so far
        self.logprobs: List[Dict[str, Any]] = []  #: per-token logprobs so far (top_logprobs=N)
        #: the prompt tokens' logprobs (prompt_logprobs=True), complete before the first text
        self.prompt_logprobs: List[Dict[str, Any]] = []
        self.results: List[Any] = []         #: data of the result frames received so far
        self.stop: Optional[str] = None      #: done.stop once ended successfully
        self.metrics: Optional[Metrics] = None  #: done.metrics once ended (if sent)
        self.error: Optional[RTXLocalAIError] = None  #: the error that ended it, if any
        self._parts: List[str] = []
        self._client = client
        self._timeout = timeout
        self._ended = False
        self._finalizer = weakref.finalize(self, client._abandon, request_id)

    # -- iteration -------------------------------------------------------

    def __iter__(self) -> "Stream":
        return self

    def __next__(self) -> str:
        while True:
            if self._ended:
                if self.error is not None:
                    raise self.error
                raise StopIteration
            try:
                f = self._client._wait(self.id, self._timeout)
            except RTXLocalAIError as e:
                self._end(error=e)
                raise
            t = f["type"]
            if t == "token":
                text = f.get("text")
                toks = f.get("tokens")
                if isinstance(toks, list):
                    self.tokens.extend(x for x in toks if isinstance(x, int))
                lps = f.get("logprobs")
                if isinstance(lps, list):
                    for e in lps:
                        if isinstance(e, dict):
                            top = [tuple(p) for p in e.get("top", []) if isinstance(p, list) and len(p) == 2]
                            ent = {"token": e.get("token"), "logprob": e.get("logprob"), "top": top}
                            if "text" in e:     # a remote model's: text, not ids (PROTOCOL.md 6.1)
                                ent["text"] = e.get("text")
                                if isinstance(e.get("bytes"), bytes):
                                    ent["bytes"] = e["bytes"]
                            self.logprobs.append(ent)
                plps = f.get("prompt_logprobs")
                if isinstance(plps, list):
                    for e in plps:
                        if isinstance(e, dict):
                            top = [tuple(p) for p in e.get("top", []) if isinstance(p, list) and len(p) == 2]
                            self.prompt_logprobs.append({"token": e.get("token"), "logprob": e.get("logprob"),
                                                         "top": top})
                if isinstance(text, str) and text:
                    self._parts.append(text)
                    return text
            elif t == "result":
                self.results.append(f.get("data"))
            elif t == "done":
                stop = f.get("stop")
                self.metrics = Metrics.from_wire(f.get("metrics"))
                self._end(stop=stop if isinstance(stop, str) else "")
            elif t == "error":
                self._end(error=error_from_frame(f))
            # other frame types (added by a newer engine) are ignored

    def _end(self, stop: Optional[str] = None, error: Optional[RTXLocalAIError] = None) -> None:
        self._ended = True
        self.stop = stop
        self.error = error
        self._finalizer.detach()
        self._client._forget(self.id)

    # -- state -----------------------------------------------------------

    @property
    def done(self) -> bool:
        """True once the request has ended (done or error)."""
        return self._ended

    @property
    def text(self) -> str:
        """The text received so far, joined."""
        return "".join(self._parts)

    def finish(self) -> Union[Generation, CallResult]:
        """Reads the request to its end and returns its outcome: a
        :class:`Generation` for generate/chat, a :class:`CallResult` for
        everything else. Raises the request's error if it ended with one."""
        for _ in self:
            pass
        if self.kind in ("generate", "chat"):
            return Generation(id=self.id, text=self.text, stop=self.stop or "", metrics=self.metrics,
                              tokens=list(self.tokens), logprobs=list(self.logprobs),
                              prompt_logprobs=list(self.prompt_logprobs))
        return CallResult(id=self.id, command=self.command, results=list(self.results), text=self.text,
                          stop=self.stop or "", metrics=self.metrics)

    # -- cancel / close ------------------------------------------------------

    def cancel(self) -> bool:
        """Asks the engine to stop this request. Returns True when the
        engine found it in flight (the stream then ends soon with stop
        ``"cancelled"``, after the pieces already sent), False when it had
        already ended. Keep iterating to read the end."""
        if self._ended:
            return False
        return self._client.cancel(self.id)

    def close(self) -> None:
        """Cancels the request if it is still running and reads it to its
        end, discarding what arrives. Errors of the request are swallowed;
        a lost connection is not."""
        if self._ended:
            return
        try:
            self.cancel()
            for _ in self:
                pass
        except EngineConnectionError:
            raise
        except RTXLocalAIError:
            pass

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None:
            self.close()
        else:
            try:
                self.close()
            except RTXLocalAIError:
                pass

    def __repr__(self) -> str:
        state = "ended" if self._ended else "running"
        return f"<Stream id={self.id} {self.kind} {state} stop={self.stop!r}>"


class RTXLocalAIClient:
    """A connection to `rlai serve` over ZeroMQ (``ipc://``, ``tcp://``)
    or the named pipe (``unix://``), speaking proto/PROTOCOL.md version 1.

    Args:
        endpoint: ``ipc://PATH``, ``tcp://HOST:PORT`` or ``unix://PATH``;
            None = the default ZeroMQ endpoint
            (``ipc://$XDG_RUNTIME_DIR/rlai/engine.zmq``, falling back to
            ``/tmp/rlai-$UID/engine.zmq``).
        timeout: default seconds to wait for each frame of a request
            (None = forever); every method takes ``timeout=`` to override.
            A request that times out is cancelled and raises
            :class:`~rtx_localai.errors.RequestTimeout`.
        connect_timeout: seconds for the connect-time ``hello`` round trip.
        client_name: the ``client`` string of the hello.
        api_key: the engine's API key for ``tcp://`` endpoints (sent as
            ZeroMQ PLAIN credentials, username ``rlai``); None = the
            ``RLAI_API_KEY`` environment variable. Not used on ``ipc://`` and
            ``unix://`` (guarded by their private directory).

    Raises:
        AuthenticationFailed: a tcp:// engine refused the key or needs one.
        EngineNotRunning: nothing answers at the endpoint within
            ``connect_timeout`` (an absent ipc/unix socket file is reported at
            once).
        ValueError: a malformed endpoint.

    Several requests may be in flight at once (their frames are told apart
    by id), and a client may be shared by threads: each request's frames go
    to its own :class:`Stream`. Use as a context manager or call
    :meth:`close`; closing disconnects, which cancels what is in flight.
    """

    def __init__(self, endpoint: Optional[str] = None, *, timeout: Optional[float] = DEFAULT_TIMEOUT,
                 connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
                 client_name: str = f"rtx-localai-python/{__version__}",
                 api_key: Optional[str] = None) -> None:
        self.endpoint: str = endpoint or default_zmq_endpoint()
        if api_key is None:
            api_key = os.environ.get("RLAI_API_KEY") or None
        self.timeout = timeout
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._queues: Dict[int, Deque[Dict[str, Any]]] = {}
        self._abandoned: Deque[int] = deque()
        self._dead: Optional[EngineConnectionError] = None
        self._closed = False
        #: Errors the engine could not attribute to a request (id 0) and
        #: frames that did not decode, most recent last.
        self.unattributed: Deque[RTXLocalAIError] = deque(maxlen=16)
        self._transport: Transport = open_transport(self.endpoint, api_key)
        try:
            #: The engine's hello answer: version, engine, model, limits.
            self.info: Dict[str, Any] = self.hello(client_name, timeout=connect_timeout)
        except RequestTimeout:
            self._shutdown()
            raise EngineNotRunning(f"the engine at {self.endpoint} did not answer within "
                                   f"{connect_timeout:g} s (is `rlai serve` running?)") from None
        except BaseException:
            self._shutdown()
            raise

    # -- lifecycle -----------------------------------------------------------

    def close(self) -> None:
        """Disconnects (the engine cancels this client's requests in flight).
        Idempotent."""
        with self._lock:
            self._shutdown()

    def _shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._transport.close()
        if self._dead is None:
            self._dead = EngineDisconnected("the client is closed")

    @property
    def closed(self) -> bool:
        """True after close()."""
        return self._closed

    def __enter__(self) -> "RTXLocalAIClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<RTXLocalAIClient {self.endpoint} {'closed' if self._closed else 'open'}>"

    # -- plumbing ------------------------------------------------------------

    def _to(self, timeout: Any) -> Optional[float]:
        return self.timeout if timeout is _UNSET else timeout

    def _send(self, type_: str, fields: Dict[str, Any]) -> int:
        with self._lock:
            if self._dead is not None:
                raise self._dead
            rid = next(self._ids)
            data = encode_request(type_, rid, fields)
            self._queues[rid] = deque()
            try:
                self._transport.send(data)
            except EngineConnectionError as e:
                del self._queues[rid]
                self._dead = e
                raise
            return rid

    def _send_untracked_cancel(self, target: int) -> None:
        """Cancels `target` without waiting for the cancel's answer (its
        frames are dropped). Call with the lock held."""
        if self._dead is not None:
            return
        try:
            self._transport.send(encode_request("cancel", next(self._ids), {"target": target}))
        except EngineConnectionError as e:
            self._dead = e

    def _abandon(self, request_id: int) -> None:
        # Runs from a weakref finalizer (any thread, maybe inside a locked
        # section): only records the id; I/O happens in the next _wait.
        self._abandoned.append(request_id)

    def _process_abandoned(self) -> None:
        while self._abandoned:
            rid = self._abandoned.popleft()
            q = self._queues.pop(rid, None)
            if q is not None and not any(f["type"] in _TERMINAL for f in q):
                self._send_untracked_cancel(rid)

    def _forget(self, request_id: int) -> None:
        with self._lock:
            self._queues.pop(request_id, None)

    def _pump(self, timeout: float) -> None:
        """Reads what arrives within `timeout` and files each frame under
        its request. Call with the lock held."""
        try:
            msgs = self._transport.recv(timeout)
        except EngineConnectionError as e:
            self._dead = e
            return
        except ProtocolError as e:  # framing error on the pipe: the connection is unusable
            self._dead = EngineDisconnected(f"connection to {self.endpoint} lost: {e}")
            return
        for data in msgs:
            try:
                f = decode_frame(data)
            except ProtocolError as e:
                self.unattributed.append(e)
                continue
            q = self._queues.get(f["id"])
            if q is not None:
                q.append(f)
            elif f["id"] == 0 and f["type"] == "error":
                self.unattributed.append(error_from_frame(f))
            # else: a frame of a request nobody waits for (abandoned, timed out)

    def _wait(self, request_id: int, timeout: Optional[float]) -> Dict[str, Any]:
        """Returns the next frame of `request_id`, waiting up to `timeout`
        seconds (None = forever). Raises RequestTimeout (after cancelling the
        request) or EngineConnectionError."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                self._process_abandoned()
                q = self._queues.get(request_id)
                if q is None:
                    raise RTXLocalAIError(f"request {request_id} is not in flight on this client")
                if q:
                    return q.popleft()
                if self._dead is not None:
                    self._queues.pop(request_id, None)
                    raise self._dead
                left = _SLICE if deadline is None else deadline - time.monotonic()
                if left <= 0:
                    self._queues.pop(request_id, None)
                    self._send_untracked_cancel(request_id)
                    raise RequestTimeout(f"request {request_id} got no frame within {timeout:g} s",
                                         request_id=request_id)
                self._pump(min(left, _SLICE))
            time.sleep(0)  # let a thread waiting for the lock in

    def _stream(self, type_: str, fields: Dict[str, Any], timeout: Any, kind: Optional[str] = None,
                command: str = "") -> Stream:
        rid = self._send(type_, fields)
        return Stream(self, rid, kind or type_, self._to(timeout), command)

    def _result(self, type_: str, fields: Dict[str, Any], timeout: Any) -> Any:
        """Runs a request answered by one result frame and returns its data."""
        out = self._stream(type_, fields, timeout).finish()
        assert isinstance(out, CallResult)
        if not out.results:
            raise ProtocolError(f"{type_}: the engine's answer had no result frame")
        return out.results[-1]

    # -- requests ------------------------------------------------------------

    def hello(self, client_name: Optional[str] = None, *, timeout: Any = _UNSET) -> Dict[str, Any]:
        """Sends ``hello`` and returns the engine's description (``version``,
        ``engine``, ``model``, ``limits``)."""
        fields = {} if client_name is None else {"client": client_name}
        data = self._result("hello", fields, timeout)
        return data if isinstance(data, dict) else {"data": data}

    def stream_generate(self, prompt: str, *, timeout: Any = _UNSET, **opts: Any) -> Stream:
        """Starts a ``generate`` of a raw prompt and returns its
        :class:`Stream`: iterate it for the text pieces.

        Generation options (all optional, engine defaults otherwise):
        ``max_tokens`` (int, 0 = until the context is full), ``temperature``
        (0 = greedy), ``top_k``, ``top_p``, ``min_p``, ``repeat_penalty``,
        ``presence_penalty``, ``frequency_penalty``, ``seed`` (uint),
        ``ignore_eos`` (bool), ``timeout_ms`` (wall-clock limit, stop
        ``"timeout"`` when it ends the generation), ``spec`` (``"off"``,
        ``"ngram"``, ``"draft"`` (the daemon's ``--draft-model``) or
        ``"auto"``: speculative decoding), ``spec_max_draft``
        (1..16), ``top_logprobs`` (0..20: per-token logprobs in
        ``Stream.logprobs`` / ``Generation.logprobs``), ``prompt_logprobs``
        (bool, with ``top_logprobs``: the prompt tokens' logprobs too, in
        ``prompt_logprobs``; the prompt is then not reused from the prefix
        cache), ``logit_bias`` (a mapping of token id to a bias in
        -100..100 added to its logit; -100 bans the token; at most 1024),
        ``prediction`` (a str the answer is expected to repeat, such as the
        file an edit returns with a few changes: drafted from, so the
        answer comes faster and is the same; at most 8192 tokens),
        ``stop`` (a str or up
        to 8 strs), ``model`` (a remote model of the daemon's upstreams,
        docs/REMOTE.md) and ``route`` (``"auto"``, ``"local"``, ``"remote"``
        or an upstream's name). An unknown option raises TypeError."""
        return self._stream("generate", {"prompt": prompt, **opts}, timeout)

    def generate(self, prompt: str, *, timeout: Any = _UNSET, **opts: Any) -> Generation:
        """Generates from a raw prompt and returns a :class:`Generation`
        (text, stop reason, metrics, token ids). Options: see
        :meth:`stream_generate`."""
        out = self.stream_generate(prompt, timeout=timeout, **opts).finish()
        assert isinstance(out, Generation)
        return out

    def chat(self, messages: Iterable[Any], stream: bool = False, *, timeout: Any = _UNSET,
             **opts: Any) -> Union[Generation, Stream]:
        """Applies the model's chat template to `messages` (mappings with
        ``role`` and ``content``, or ``(role, content)`` pairs) and
        generates the assistant's answer. Returns a :class:`Generation`, or
        with ``stream=True`` a :class:`Stream` of text pieces. Options: see
        :meth:`stream_generate`."""
        s = self._stream("chat", {"messages": list(messages), **opts}, timeout)
        if stream:
            return s
        out = s.finish()
        assert isinstance(out, Generation)
        return out

    @staticmethod
    def _params(params: Any) -> Optional[str]:
        if params is None:
            return None
        if isinstance(params, str):
            return params
        return json.dumps(params, ensure_ascii=False, separators=(",", ":"))

    def stream_call(self, command: str, params: Any = None, *, timeout: Any = _UNSET,
                    timeout_ms: Optional[int] = None) -> Stream:
        """Starts a ``call`` of a daemon/plugin command (``params``: a
        JSON-serialisable value, or JSON text as a str; None = ``{}``) and
        returns its :class:`Stream`: iterate it for the text pieces the
        command streams; :meth:`Stream.finish` then gives the
        :class:`CallResult`. ``timeout_ms`` is the call's deadline in the
        engine (None: the command's or the daemon's default); past it the
        call raises :class:`~rtx_localai.errors.DeadlineExceeded`."""
        fields = {"command": command, "params": self._params(params)}
        if timeout_ms is not None:
            fields["timeout_ms"] = timeout_ms
        return self._stream("call", fields, timeout, command=command)

    def call(self, command: str, params: Any = None, *, timeout: Any = _UNSET,
             timeout_ms: Optional[int] = None) -> CallResult:
        """Calls a daemon/plugin command and returns a :class:`CallResult`
        (``results``: every result frame's data, ``data``: the last one,
        ``text``: streamed text, ``stop``, ``metrics``). An unknown command
        raises :class:`~rtx_localai.errors.NotFound`, bad params
        :class:`~rtx_localai.errors.BadRequest`, a call past its deadline
        (``timeout_ms``, see :meth:`stream_call`)
        :class:`~rtx_localai.errors.DeadlineExceeded`."""
        out = self.stream_call(command, params, timeout=timeout, timeout_ms=timeout_ms).finish()
        assert isinstance(out, CallResult)
        return out

    def commands(self, *, timeout: Any = _UNSET) -> List[Dict[str, Any]]:
        """The commands :meth:`call` accepts: a list of maps with ``name``
        and ``description`` (and, from the plugin host, ``parameters``,
        ``plugin``, ``streams``)."""
        data = self._result("commands", {}, timeout)
        cmds = data.get("commands") if isinstance(data, dict) else None
        if not isinstance(cmds, list):
            raise ProtocolError("commands: the answer has no 'commands' array")
        return cmds

    def plugins(self, *, timeout: Any = _UNSET) -> List[Dict[str, Any]]:
        """The loaded plugins (from the ``commands`` answer): maps with
        ``name``, ``version``, ``description``, ``dir``, ``commands``. Empty
        when the engine runs no plugin host or loaded none."""
        data = self._result("commands", {}, timeout)
        plugins = data.get("plugins") if isinstance(data, dict) else None
        return plugins if isinstance(plugins, list) else []

    def stats(self, *, timeout: Any = _UNSET) -> Dict[str, Any]:
        """The daemon's statistics (a map; see docs/SERVE.md)."""
        data = self._result("stats", {}, timeout)
        if not isinstance(data, dict):
            raise ProtocolError("stats: the answer is not a map")
        return data

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False,
                 timeout: Any = _UNSET) -> List[int]:
        """Token ids of `text` with the engine's tokenizer. ``add_special``
        adds BOS/EOS as the model wants; ``parse_special`` turns special-token
        text such as ``<|im_end|>`` into its token."""
        data = self._result("tokenize", {"text": text, "add_special": add_special,
                                         "parse_special": parse_special}, timeout)
        toks = data.get("tokens") if isinstance(data, dict) else None
        if not isinstance(toks, list):
            raise ProtocolError("tokenize: the answer has no 'tokens' array")
        return toks

    def cancel(self, target: Union[int, Stream], *, timeout: Any = _UNSET) -> bool:
        """Cancels a request of this client (its id or its Stream). Returns
        True when the engine found it in flight (it then ends with stop
        ``"cancelled"``, or its normal end if that came first), False when it
        had already ended (the engine answered NOT_FOUND)."""
        tid = target.id if isinstance(target, Stream) else target
        try:
            self._stream("cancel", {"target": tid}, timeout).finish()
        except NotFound:
            return False
        return True
