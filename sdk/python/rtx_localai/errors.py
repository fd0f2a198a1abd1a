"""Exceptions raised by the RTX-LocalAI client.

Every exception is an :class:`RTXLocalAIError`. Errors reported by the
engine in an ``error`` frame (proto/PROTOCOL.md, section 8) are raised as
the subclass of their code and carry ``code``, ``name`` and ``message``
exactly as sent; the client also raises :class:`TooLarge` itself for a
request it must not send (over the 4 MiB frame limit, which libzmq would
answer by dropping the connection without an error frame).

Connection problems are :class:`EngineConnectionError`, which is also a
builtin :class:`ConnectionError`; a request that sees nothing within its
timeout raises :class:`RequestTimeout`, also a builtin :class:`TimeoutError`.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Type

__all__ = [
    "RTXLocalAIError",
    "EngineConnectionError",
    "EngineNotRunning",
    "EngineDisconnected",
    "AuthenticationFailed",
    "RequestTimeout",
    "ProtocolError",
    "EngineErrorFrame",
    "BadFrame",
    "BadVersion",
    "BadRequest",
    "TooLarge",
    "Busy",
    "NotFound",
    "Cancelled",
    "ContextFull",
    "EngineFailure",
    "DuplicateId",
    "Shutdown",
    "InternalError",
    "EngineNotImplemented",
    "DeadlineExceeded",
    "ERROR_CLASSES",
    "error_from_frame",
]


class RTXLocalAIError(Exception):
    """Base class of every error raised by this package.

    Attributes:
        code: the protocol error code (1..14, or another positive int sent by
            a newer engine) when the error comes from an ``error`` frame or
            mirrors one; ``None`` for client-side conditions (connection,
            timeout, undecodable frame).
        name: the protocol name of the code (``"NOT_FOUND"``), or ``None``.
        message: the human-readable text (the frame's ``msg``).
        request_id: the id of the request the error ended, when known.
    """

    code: Optional[int] = None
    name: Optional[str] = None

    def __init__(self, message: str = "", *, code: Optional[int] = None, name: Optional[str] = None,
                 request_id: Optional[int] = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if name is not None:
            self.name = name
        self.request_id = request_id

    def __str__(self) -> str:
        if self.name:
            return f"{self.name} ({self.code}): {self.message}" if self.message else f"{self.name} ({self.code})"
        return self.message


# ------------------------------------------------------------ client side


class EngineConnectionError(RTXLocalAIError, ConnectionError):
    """The engine cannot be reached or the connection was lost."""


class EngineNotRunning(EngineConnectionError):
    """Nothing answers at the endpoint (no `rlai serve` there, or it did not
    answer the connect-time ``hello`` in time)."""


class AuthenticationFailed(EngineConnectionError, PermissionError):
    """The engine's tcp:// endpoint refused the API key, or wants one that
    was not given (``api_key=`` / ``RLAI_API_KEY``), or takes none."""


class EngineDisconnected(EngineConnectionError):
    """The engine went away (exited, crashed, or stopped answering ZeroMQ
    heartbeats for 1.5 s). The client is unusable afterwards: make a new one."""


class RequestTimeout(RTXLocalAIError, TimeoutError):
    """No frame of the request arrived within its timeout. The client sends
    a cancel for the request before raising."""


class ProtocolError(RTXLocalAIError):
    """The engine sent something this client cannot decode."""


# ----------------------------------------------------------- error frames


class EngineErrorFrame(RTXLocalAIError):
    """Base class of the errors that mirror an ``error`` frame's code."""


class BadFrame(EngineErrorFrame):
    """BAD_FRAME (1): not msgpack, not a map, truncated, trailing bytes."""
    code, name = 1, "BAD_FRAME"


class BadVersion(EngineErrorFrame):
    """BAD_VERSION (2): ``v`` missing or not 1."""
    code, name = 2, "BAD_VERSION"


class BadRequest(EngineErrorFrame, ValueError):
    """BAD_REQUEST (3): a missing, ill-typed or out-of-range field, or
    parameters the command rejects."""
    code, name = 3, "BAD_REQUEST"


class TooLarge(EngineErrorFrame, ValueError):
    """TOO_LARGE (4): a frame, string, array, nesting or prompt over a limit."""
    code, name = 4, "TOO_LARGE"


class Busy(EngineErrorFrame):
    """BUSY (5): too many requests in flight (per client or in total)."""
    code, name = 5, "BUSY"


class NotFound(EngineErrorFrame, LookupError):
    """NOT_FOUND (6): unknown command or cancel target."""
    code, name = 6, "NOT_FOUND"


class Cancelled(EngineErrorFrame):
    """CANCELLED (7): the request was cancelled or the engine is stopping."""
    code, name = 7, "CANCELLED"


class ContextFull(EngineErrorFrame):
    """CONTEXT_FULL (8): prompt plus generation exceed the context."""
    code, name = 8, "CONTEXT_FULL"


class EngineFailure(EngineErrorFrame):
    """ENGINE (9): inference failed."""
    code, name = 9, "ENGINE"


class DuplicateId(EngineErrorFrame):
    """DUPLICATE_ID (10): a request with this id is already in flight."""
    code, name = 10, "DUPLICATE_ID"


class Shutdown(EngineErrorFrame):
    """SHUTDOWN (11): the engine is stopping; the request was not run."""
    code, name = 11, "SHUTDOWN"


class InternalError(EngineErrorFrame):
    """INTERNAL (12): a daemon bug or out of memory. Also raised for an
    error code this client does not know (the protocol says to treat it
    like INTERNAL); ``code`` and ``name`` then keep what the engine sent."""
    code, name = 12, "INTERNAL"


class EngineNotImplemented(EngineErrorFrame, NotImplementedError):
    """NOT_IMPLEMENTED (13): request type or feature not supported."""
    code, name = 13, "NOT_IMPLEMENTED"


class DeadlineExceeded(EngineErrorFrame, TimeoutError):
    """TIMEOUT (14): the request ran past its deadline in the engine (a
    plugin call past its ``timeout_ms``). Unlike :class:`RequestTimeout`
    this is the engine's answer, not the client giving up."""
    code, name = 14, "TIMEOUT"


ERROR_CLASSES: Dict[int, Type[EngineErrorFrame]] = {
    cls.code: cls
    for cls in (BadFrame, BadVersion, BadRequest, TooLarge, Busy, NotFound, Cancelled, ContextFull,
                EngineFailure, DuplicateId, Shutdown, InternalError, EngineNotImplemented, DeadlineExceeded)
}


def error_from_frame(frame: Dict[str, Any]) -> EngineErrorFrame:
    """Builds the exception for a decoded ``error`` frame (a dict with
    ``code``, ``name``, ``msg``). Unknown codes map to :class:`InternalError`
    keeping the code and name received."""
    code = frame.get("code")
    name = frame.get("name")
    msg = frame.get("msg")
    if not isinstance(code, int) or isinstance(code, bool):
        code = InternalError.code
    cls = ERROR_CLASSES.get(code, InternalError)
    return cls(msg if isinstance(msg, str) else "",
               code=code, name=name if isinstance(name, str) and name else cls.name,
               request_id=frame.get("id") if isinstance(frame.get("id"), int) else None)
