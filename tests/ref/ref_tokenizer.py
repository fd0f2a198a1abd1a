"""Small byte-level BPE tokenizer (GPT-2 style) for sanity checks only.

The engine tests take their token ids from ``rlai-logits --tokenize``; this
tokenizer lets the reference be exercised on its own (e.g. the "Paris" check)
and cross-checks the engine's ids on the plain ASCII test prompts.
Pre-tokenizer: GPT-2 pattern, hand-written; for "smollm"/"starcoder" every
digit is first isolated.
"""

from __future__ import annotations

from ref_model import gpt2_byte_chars

DIGIT_SPLIT_PRE = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"}
CONTRACTIONS = ("re", "ve", "ll", "s", "t", "m", "d")


def _cls(ch):
    if ch.isalpha():
        return "L"
    if ch.isnumeric():
        return "N"
    if ch.isspace():
        return "S"
    return "P"


def gpt2_split(s):
    out, i, n = [], 0, len(s)
    while i < n:
        c = s[i]
        if c == "'":
            m = next((x for x in CONTRACTIONS if s.startswith(x, i + 1)), None)
            if m is not None:
                out.append("'" + m)
                i += 1 + len(m)
                continue
        j = i + 1 if (c == " " and i + 1 < n and not s[i + 1].isspace()) else i
        k = _cls(s[j])
        if k != "S":
            e = j + 1
            while e < n and _cls(s[e]) == k:
                e += 1
            out.append(s[i:e])
            i = e
            continue
        e = i
        while e < n and s[e].isspace():
            e += 1
        if e < n and e - i > 1:
            e -= 1              # last space joins the following word
        out.append(s[i:e])
        i = e
    return out


class SimpleBPE:
    def __init__(self, tokens, token_types, merges, pre):
        self.vocab = {t: i for i, t in enumerate(tokens)}
        self.ranks = {}
        for r, m in enumerate(merges):
            sp = m.index(" ", 1)
            self.ranks[(m[:sp], m[sp + 1:])] = r
        self.special = sorted((t for t, ty in zip(tokens, token_types) if ty in (3, 4)),
                              key=len, reverse=True)
        self.bmap = gpt2_byte_chars()
        self.digit_split = pre in DIGIT_SPLIT_PRE

    @classmethod
    def from_model(cls, m):
        return cls(m.tokens, m.token_types, m.merges, m.pre)

    def _bpe(self, piece):
        syms = [self.bmap[b] for b in piece.encode("utf-8")]
        while len(syms) > 1:
            best, bi = None, -1
            for i in range(len(syms) - 1):
                r = self.ranks.get((syms[i], syms[i + 1]))
                if r is not None and (best is None or r < best):
                    best, bi = r, i
            if best is None:
                break
            syms[bi:bi + 2] = [syms[bi] + syms[bi + 1]]
        ids = []
        for s in syms:
            if s in self.vocab:
                ids.append(self.vocab[s])
            else:
                ids.extend(self.vocab[ch] for ch in s)
        return ids

    def _pieces(self, text):
        parts = [text]
        if self.digit_split:
            parts, cur = [], ""
            for ch in text:
                if ch.isnumeric():
                    if cur:
                        parts.append(cur)
                    parts.append(ch)
                    cur = ""
                else:
                    cur += ch
            if cur:
                parts.append(cur)
        out = []
        for p in parts:
            out.extend(gpt2_split(p))
        return out

    def encode(self, text):
        ids, i, frag = [], 0, ""
        while i < len(text):
            sp = next((s for s in self.special if text.startswith(s, i)), None)
            if sp is None:
                frag += text[i]
                i += 1
                continue
            for p in self._pieces(frag):
                ids.extend(self._bpe(p))
            frag = ""
            ids.append(self.vocab[sp])
            i += len(sp)
        for p in self._pieces(frag):
            ids.extend(self._bpe(p))
        return ids
