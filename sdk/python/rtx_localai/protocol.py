"""The wire protocol of proto/PROTOCOL.md (version 1): encoding requests,
decoding frames, limits and the default endpoints.

Requests are encoded deterministically as the protocol's section 3 rule 9
asks: ``v``, ``id``, ``type``, then the fields in the order of the
protocol's tables, unset optional fields omitted (booleans omitted when
equal to their default), integers in their shortest form and floats as
float64, so the output matches the test vectors byte for byte.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, Iterable, List, Mapping, Sequence, Tuple, Union

import msgpack

from .errors import ProtocolError, TooLarge

__all__ = [
    "VERSION",
    "MAX_FRAME",
    "MAX_STR",
    "GEN_OPTIONS",
    "runtime_dir",
    "default_zmq_endpoint",
    "default_pipe_endpoint",
    "gen_fields",
    "encode_request",
    "decode_frame",
]

VERSION = 1
MAX_FRAME = 4 << 20          # bytes per message (both transports)
MAX_STR = 1 << 20            # bytes per string field
MAX_NAME = 256               # bytes per name string

# Generation options (section 5.3) in wire order, with their kind.
GEN_OPTIONS: Tuple[Tuple[str, str], ...] = (
    ("max_tokens", "int"),
    ("temperature", "float"),
    ("top_k", "int"),
    ("top_p", "float"),
    ("min_p", "float"),
    ("repeat_penalty", "float"),
    ("presence_penalty", "float"),
    ("frequency_penalty", "float"),
    ("seed", "uint"),
    ("ignore_eos", "bool"),
    ("timeout_ms", "uint32"),
    ("spec", "spec"),
    ("spec_max_draft", "draft"),
    ("top_logprobs", "toplp"),
    ("response_format", "json"),
    ("stop", "strs"),
    ("model", "name"),
    ("route", "name"),
    ("prompt_logprobs", "bool"),
    ("logit_bias", "bias"),
    ("prediction", "text"),
)
MAX_LOGIT_BIAS = 1024        # logit_bias entries
SPEC_MODES = ("off", "ngram", "draft", "auto")
_GEN_NAMES = frozenset(n for n, _ in GEN_OPTIONS)

REQUEST_TYPES = ("hello", "generate", "chat", "call", "cancel", "commands", "stats", "tokenize")
FRAME_TYPES = ("token", "result", "done", "error")


# ------------------------------------------------------------- endpoints


def runtime_dir() -> str:
    """The private directory of the default endpoints:
    ``$XDG_RUNTIME_DIR/rlai`` when XDG_RUNTIME_DIR is an absolute path,
    else ``/tmp/rlai-$UID`` (as include/rlai/client.h does)."""
    xdg = os.environ.get("XDG_RUNTIME_DIR", "")
    if xdg.startswith("/"):
        return f"{xdg}/rlai"
    return f"/tmp/rlai-{os.getuid()}"


def default_zmq_endpoint() -> str:
    """``ipc://$XDG_RUNTIME_DIR/rlai/engine.zmq`` (fallback ``/tmp/rlai-$UID``)."""
    return f"ipc://{runtime_dir()}/engine.zmq"


def default_pipe_endpoint() -> str:
    """``unix://$XDG_RUNTIME_DIR/rlai/engine.sock`` (fallback ``/tmp/rlai-$UID``)."""
    return f"unix://{runtime_dir()}/engine.sock"


# -------------------------------------------------------------- encoding


def _int(name: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not lo <= value <= hi:
        raise ValueError(f"{name}={value} is out of range {lo}..{hi}")
    return value


def _str(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    return value


def gen_fields(opts: Mapping[str, Any]) -> List[Tuple[str, Any]]:
    """Checks generation options (section 5.3) and returns them as
    ``(name, wire value)`` pairs in wire order. ``None`` means unset.
    Raises TypeError for an unknown option or a value of the wrong type,
    ValueError for an int out of its range. Range checks of floats are left
    to the engine (it answers BAD_REQUEST)."""
    unknown = set(opts) - _GEN_NAMES
    if unknown:
        raise TypeError("unknown generation option(s): " + ", ".join(sorted(unknown))
                        + " (known: " + ", ".join(n for n, _ in GEN_OPTIONS) + ")")
    out: List[Tuple[str, Any]] = []
    for name, kind in GEN_OPTIONS:
        v = opts.get(name)
        if v is None:
            continue
        if kind == "int":
            v = _int(name, v, 0, 2**31 - 1)
        elif kind == "uint":
            v = _int(name, v, 0, 2**64 - 1)
        elif kind == "uint32":
            v = _int(name, v, 0, 2**32 - 1)
        elif kind == "float":
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise TypeError(f"{name} must be a number, not {type(v).__name__}")
            v = float(v)
        elif kind == "spec":
            v = _str(name, v)
            if v not in SPEC_MODES:
                raise ValueError(f"spec={v!r}: must be one of " + ", ".join(SPEC_MODES)
                                 + ("; self-speculative drafting is not implemented"
                                    if v == "self" else ""))
        elif kind == "draft":
            v = _int(name, v, 1, 16)
        elif kind == "toplp":
            v = _int(name, v, 0, 20)
        elif kind == "json":
            # an OpenAI response_format object, sent as its JSON text
            if isinstance(v, Mapping):
                v = json.dumps(v)
            v = _str(name, v)
        elif kind == "name":
            # where it runs (docs/REMOTE.md): a remote model / a route
            v = _str(name, v)
            if len(v.encode()) > MAX_NAME:
                raise ValueError(f"{name} has more than {MAX_NAME} bytes")
        elif kind == "text":
            # predicted outputs: text the answer is expected to repeat
            v = _str(name, v)
            if len(v.encode()) > MAX_STR:
                raise ValueError(f"{name} has more than {MAX_STR} bytes")
            if not v:
                continue  # none: omitted
        elif kind == "bool":
            if not isinstance(v, bool):
                raise TypeError(f"{name} must be a bool, not {type(v).__name__}")
            if not v:
                continue  # the default: omitted
        elif kind == "bias":
            # token id (int, or a str of digits as in OpenAI's JSON) -> bias in -100..100
            if not isinstance(v, Mapping):
                raise TypeError(f"{name} must be a mapping of token id to bias, not {type(v).__name__}")
            if len(v) > MAX_LOGIT_BIAS:
                raise ValueError(f"{name} has more than {MAX_LOGIT_BIAS} entries")
            m: Dict[int, float] = {}
            for tok, b in v.items():
                if isinstance(tok, str) and tok.isdigit():
                    tok = int(tok)
                tok = _int(f"{name} key", tok, 0, 2**31 - 1)
                if isinstance(b, bool) or not isinstance(b, (int, float)):
                    raise TypeError(f"{name}[{tok}] must be a number, not {type(b).__name__}")
                if not -100 <= b <= 100:
                    raise ValueError(f"{name}[{tok}]={b} is out of range -100..100")
                m[tok] = float(b)
            if not m:
                continue
            v = m
        else:  # strs
            if isinstance(v, str):
                v = [v]
            v = [_str(name, s) for s in v]
        out.append((name, v))
    return out


def _messages(messages: Iterable[Any]) -> List[Dict[str, str]]:
    out = []
    for i, m in enumerate(messages):
        if isinstance(m, Mapping):
            role, content = m.get("role"), m.get("content")
        elif isinstance(m, Sequence) and not isinstance(m, str) and len(m) == 2:
            role, content = m[0], m[1]
        else:
            raise TypeError(f"messages[{i}] must be a mapping with role and content or a (role, content) pair")
        out.append({"role": _str(f"messages[{i}].role", role), "content": _str(f"messages[{i}].content", content)})
    return out


def encode_request(type_: str, id_: int, fields: Union[Mapping[str, Any], Sequence[Tuple[str, Any]], None] = None) -> bytes:
    """Encodes one request message.

    ``fields`` are the type's fields (a mapping or ``(name, value)`` pairs),
    validated and put into wire order:

    * hello: ``client``
    * generate: ``prompt`` + generation options
    * chat: ``messages`` (mappings with role/content or pairs) + options
    * call: ``command``, ``params`` (JSON text)
    * cancel: ``target``
    * commands, stats: none
    * tokenize: ``text``, ``add_special`` (default True), ``parse_special``
      (default False)

    Raises TypeError/ValueError for bad values and :class:`TooLarge` when
    the encoded message is over 4 MiB (libzmq would drop the connection).
    """
    if type_ not in REQUEST_TYPES:
        raise ValueError(f"unknown request type {type_!r}")
    _int("id", id_, 0, 2**64 - 1)
    f: Dict[str, Any] = dict(fields or {})
    msg: Dict[str, Any] = {"v": VERSION, "id": id_, "type": type_}

    def take(name: str) -> Any:
        return f.pop(name, None)

    if type_ == "hello":
        client = take("client")
        if client is not None:
            msg["client"] = _str("client", client)
    elif type_ in ("generate", "chat"):
        if type_ == "generate":
            prompt = take("prompt")
            if prompt is None:
                raise TypeError("generate needs a prompt")
            msg["prompt"] = _str("prompt", prompt)
        else:
            messages = take("messages")
            if messages is None:
                raise TypeError("chat needs messages")
            msg["messages"] = _messages(messages)
        msg.update(gen_fields(f))  # every other field must be a generation option
        f = {}
    elif type_ == "call":
        command = take("command")
        if command is None:
            raise TypeError("call needs a command")
        msg["command"] = _str("command", command)
        params = take("params")
        if params is not None:
            msg["params"] = _str("params", params)
        timeout_ms = take("timeout_ms")
        if timeout_ms is not None:
            msg["timeout_ms"] = _int("timeout_ms", timeout_ms, 1, 86400000)
    elif type_ == "cancel":
        target = take("target")
        if target is None:
            raise TypeError("cancel needs a target")
        msg["target"] = _int("target", target, 0, 2**64 - 1)
    elif type_ == "tokenize":
        text = take("text")
        if text is None:
            raise TypeError("tokenize needs a text")
        msg["text"] = _str("text", text)
        add_special, parse_special = take("add_special"), take("parse_special")
        for name, v, default in (("add_special", add_special, True), ("parse_special", parse_special, False)):
            if v is None:
                continue
            if not isinstance(v, bool):
                raise TypeError(f"{name} must be a bool")
            if v != default:
                msg[name] = v
    if f:
        raise TypeError(f"unknown field(s) for {type_}: " + ", ".join(sorted(f)))
    data: bytes = msgpack.packb(msg, use_bin_type=True)
    if len(data) > MAX_FRAME:
        raise TooLarge(f"request is {len(data)} bytes; a message may be at most {MAX_FRAME} bytes",
                       code=TooLarge.code, name=TooLarge.name)
    return data


# -------------------------------------------------------------- decoding


def decode_frame(data: bytes) -> Dict[str, Any]:
    """Decodes one message from the engine into a dict with at least
    ``v``, ``id`` (int) and ``type`` (str). Raises :class:`ProtocolError`
    for anything that is not such a map. ``result`` data keeps msgpack's
    natural Python form (maps may have non-string keys)."""
    try:
        obj = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as e:  # msgpack raises several exception types
        raise ProtocolError(f"undecodable frame from the engine ({len(data)} bytes): {e}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"frame is a {type(obj).__name__}, not a map")
    fid, ftype = obj.get("id"), obj.get("type")
    if isinstance(fid, bool) or not isinstance(fid, int) or fid < 0:
        raise ProtocolError("frame without a valid id")
    if not isinstance(ftype, str):
        raise ProtocolError("frame without a type")
    v = obj.get("v")
    if v != VERSION:
        raise ProtocolError(f"frame of protocol version {v!r}, this client speaks {VERSION}")
    return obj
