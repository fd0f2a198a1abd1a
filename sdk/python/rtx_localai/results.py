"""Result objects returned by the client."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

__all__ = ["Metrics", "Generation", "CallResult", "STOP_REASONS"]

# done.stop values of generations (section 6.3); "" for requests that do
# not generate. An unknown reason is treated like "eog" by the protocol.
STOP_REASONS = ("eog", "max_tokens", "stop_string", "context", "cancelled", "timeout")


def _num(m: Mapping[str, Any], key: str, kind: type) -> Any:
    v = m.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return kind(0)
    return kind(v)


@dataclass(frozen=True)
class Metrics:
    """The ``metrics`` of a ``done`` frame (section 6.3)."""

    queue_ms: float = 0.0       #: time between arrival and start of processing
    ttft_ms: float = 0.0        #: time from start to the first token
    prefill_tps: float = 0.0    #: prompt tokens per second
    decode_tps: float = 0.0     #: generated tokens per second
    prompt_tokens: int = 0      #: prompt length in tokens
    gen_tokens: int = 0         #: tokens generated
    reused_tokens: int = 0      #: prompt tokens served from the KV (prefix) cache
    drafted_tokens: int = 0     #: speculative draft tokens verified
    accepted_tokens: int = 0    #: of those, accepted
    where: str = ""             #: where it ran: "local" or "upstream:NAME" ("" = not said)

    @classmethod
    def from_wire(cls, m: Any) -> Optional["Metrics"]:
        """Builds Metrics from a frame's metrics map (missing fields are 0,
        unknown ones ignored); ``None`` when the frame had none."""
        if not isinstance(m, Mapping):
            return None
        return cls(queue_ms=_num(m, "queue_ms", float), ttft_ms=_num(m, "ttft_ms", float),
                   prefill_tps=_num(m, "prefill_tps", float), decode_tps=_num(m, "decode_tps", float),
                   prompt_tokens=_num(m, "prompt_tokens", int), gen_tokens=_num(m, "gen_tokens", int),
                   reused_tokens=_num(m, "reused_tokens", int),
                   drafted_tokens=_num(m, "drafted_tokens", int),
                   accepted_tokens=_num(m, "accepted_tokens", int),
                   where=m["where"] if isinstance(m.get("where"), str) else "")


@dataclass
class Generation:
    """The outcome of a generate or chat request."""

    id: int                         #: the request id
    text: str                       #: the generated text (stop strings excluded)
    stop: str                       #: why it ended: eog, max_tokens, stop_string, context, cancelled, timeout
    metrics: Optional[Metrics]      #: the done frame's metrics (None if the engine sent none)
    tokens: List[int] = field(default_factory=list)  #: token ids, in order
    #: with ``top_logprobs=N``: one dict per generated token, ``{"token": id,
    #: "logprob": float, "top": [(id, logprob), ...]}`` (raw-logit
    #: log-softmax, natural log; PROTOCOL.md 6.1); empty otherwise. A
    #: remote model's (docs/REMOTE.md) have text instead of ids:
    #: ``{"token": None, "text": str, "logprob": float, "top": [(text,
    #: logprob), ...], "bytes": b"..."}`` ("bytes" when the upstream sent them)
    logprobs: List[Dict[str, Any]] = field(default_factory=list)
    #: with ``prompt_logprobs=True`` (and ``top_logprobs=N``): one dict per
    #: PROMPT token, in order, as in ``logprobs``; the first has
    #: ``"logprob": None`` and no ``top`` (nothing precedes it). Scoring a
    #: text: ``sum(e["logprob"] for e in g.prompt_logprobs[1:])``
    prompt_logprobs: List[Dict[str, Any]] = field(default_factory=list)

    @property
    def cancelled(self) -> bool:
        """True when the generation was stopped by a cancel."""
        return self.stop == "cancelled"

    @property
    def timed_out(self) -> bool:
        """True when the generation hit its deadline (``timeout_ms`` or the
        daemon's ``limits.request_timeout_s``); :attr:`text` holds what came
        before it."""
        return self.stop == "timeout"


@dataclass
class CallResult:
    """The outcome of a ``call`` of a daemon/plugin command."""

    id: int                         #: the request id
    command: str                    #: the command called
    results: List[Any]              #: the data of every result frame, in order
    text: str                       #: the text pieces the command streamed, joined
    stop: str                       #: the done frame's stop ("" unless the call generated)
    metrics: Optional[Metrics]      #: present when the call ran an engine job

    @property
    def data(self) -> Any:
        """The data of the last result frame (a command normally replies
        once), or None when there was none."""
        return self.results[-1] if self.results else None
