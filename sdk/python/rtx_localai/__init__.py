"""rtx_localai: Python client of the RTX-LocalAI engine daemon (`rlai serve`).

It speaks the msgpack protocol of proto/PROTOCOL.md (version 1) over
ZeroMQ (DEALER to the engine's ROUTER) or the named pipe (Unix socket,
4-byte big-endian length framing)::

    from rtx_localai import RTXLocalAIClient

    with RTXLocalAIClient() as ai:
        print(ai.generate("The capital of France is", max_tokens=8).text)
"""
__version__ = "0.1.0"

from .errors import (ERROR_CLASSES, AuthenticationFailed, BadFrame, BadRequest, BadVersion, Busy, Cancelled, ContextFull,  # noqa: E402
                     DeadlineExceeded, DuplicateId, EngineConnectionError, EngineDisconnected, EngineErrorFrame, EngineFailure,
                     EngineNotImplemented, EngineNotRunning, InternalError, NotFound, ProtocolError,
                     RequestTimeout, RTXLocalAIError, Shutdown, TooLarge, error_from_frame)
from .protocol import default_pipe_endpoint, default_zmq_endpoint  # noqa: E402
from .results import CallResult, Generation, Metrics  # noqa: E402
from .client import RTXLocalAIClient, Stream  # noqa: E402

__all__ = [
    "__version__",
    "RTXLocalAIClient", "Stream", "Generation", "CallResult", "Metrics",
    "default_zmq_endpoint", "default_pipe_endpoint",
    "RTXLocalAIError", "EngineConnectionError", "EngineNotRunning", "EngineDisconnected", "AuthenticationFailed", "RequestTimeout",
    "ProtocolError", "EngineErrorFrame", "BadFrame", "BadVersion", "BadRequest", "TooLarge", "Busy", "NotFound",
    "Cancelled", "ContextFull", "EngineFailure", "DuplicateId", "Shutdown", "InternalError",
    "EngineNotImplemented", "DeadlineExceeded", "ERROR_CLASSES", "error_from_frame",
]
