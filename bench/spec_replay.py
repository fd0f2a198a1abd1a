#!/usr/bin/env python3
"""spec_replay.py - replays bench_spec's greedy outputs through n-gram
drafters, to compare drafting rules without running the model.

    build/bench/bench_spec --tokens 256 --reps 1 --dump /tmp/spec.ids
    bench/spec_replay.py /tmp/spec.ids [--row-cost 0.33]

Greedy output does not depend on drafting (batch-invariant kernels), so
each case's output is fixed: a drafter is replayed step by step over it,
a draft is accepted up to its first token that differs from the output,
and a step that feeds 1 + k rows costs 1 + k * ROW_COST plain decode steps
(--row-cost: bench_spec's "step cost" column gives it for a machine; 0.33
on 2 AVX2 cores). It prints, per prompt (a1..d3) and per case, the
estimated speedup (output tokens over the cost of the steps) and tokens per
step of:

  engine   the engine's drafter (engine/spec.c): longest suffix match up to
           8 tokens, none for a 1-token match, 1 token for an ambiguous
           2-token match, at most the match's length unless it continues
           the passage the last accepted draft was copied from, with the
           adaptive draft length and the pausing of rlai_spec_state (cost
           from --row-cost)
  uncapped the drafter before 2026-12-06 (no cap by match length), same
           adaptive length and pausing
  len-oracle  the engine's choice of match, told the accepted length in
           advance (drafts exactly what will be accepted, nothing else)
  oracle   the best continuation among all earlier matches of any length,
           with the exact accepted length: a bound for prompt lookup
  tree2    a tree draft the engine does not build: the continuations of
           the two longest matches that start with different tokens, both
           verified in the step (it pays for the rows of both), the better
           one accepted
  ev       the engine's match with its length chosen by expected value
           from acceptance rates the request learns per kind of match
           (expected_value()), without the adaptive length or pausing

Replaying the drafter of 2026-12-03 gave bench_spec's measured tokens per
step to within 2 % on three cases and 12 % high on code editing: the
pausing in the engine follows measured step times, which this replay
models as a fixed row cost.
"""
import argparse
import sys

MAX_DRAFT = 8        # the engine's default spec_max_draft
HARD_CAP = 16        # RLAI_SPEC_MAX_DRAFT


def load(path):
    cases = []
    with open(path) as f:
        for line in f:
            name, rest = line.split(' ', 1)
            p, o = rest.split('|')
            cases.append((name, [int(x) for x in p.split()], [int(x) for x in o.split()]))
    return cases


NEAR_BEFORE, NEAR_AFTER = 8, 32   # RLAI_SPEC_NEAR_BEFORE / _AFTER


def longest_match(t, near=-1):
    """The scan of engine/spec.c rlai_spec_ngram_draft (NGRAM_MAX 8,
    NGRAM_MIN 2): (match length, index of the continuation's first token,
    whether occurrences of that length disagree on it, whether it continues
    the passage being copied), or None below 2 tokens."""
    n = len(t)
    last, best, bi, amb = t[-1], 0, -1, False
    for i in range(n - 2, max(n - 8192, 0) - 1, -1):
        if t[i] != last:
            continue
        L = 1
        while L < 8 and i - L >= 0 and t[i - L] == t[n - 1 - L]:
            L += 1
        if L > best:
            best, bi, amb = L, i, False
        elif L == best and t[i + 1] != t[bi + 1]:
            amb = True
    if best < 2:
        return None
    frm = bi + 1
    copying = near >= 0 and near - NEAR_BEFORE <= frm <= near + NEAR_AFTER
    return best, frm, amb, copying


def draft_engine(t, g, near=-1, cap=True):
    """engine/spec.c rlai_spec_ngram_draft: returns (draft, index of its
    first token in t)."""
    m = longest_match(t, near)
    if m is None:
        return [], -1
    best, frm, amb, copying = m
    k = min(len(t) - frm, g)
    if cap and not copying:
        k = min(k, best)
    if best == 2 and amb:
        k = min(k, 1)
    return t[frm:frm + k], frm


class State:
    """rlai_spec_state (engine/spec.c): adaptive gamma and pausing."""

    def __init__(self, max_draft):
        self.max_draft, self.gamma = max_draft, min(4, max_draft)
        self.backoff, self.gain, self.pause, self.misses = 4, 1.25, 0, 0
        self.near = -1

    def next_gamma(self):
        if self.pause > 0:
            self.pause -= 1
            return 0
        return self.gamma

    def _pause(self):
        self.pause = self.backoff
        self.backoff = min(self.backoff * 2, 64)

    def feedback(self, drafted, accepted, cost):
        if drafted <= 0:
            return
        if accepted == drafted:
            self.gamma = min(self.gamma + 2, self.max_draft)
        else:
            self.gamma = max(min(max(accepted + 1, self.gamma - 1), self.gamma), 1)
        self.gain = 0.75 * self.gain + 0.25 * (1 + accepted) / cost
        if self.gain < 1.0:
            self._pause()
            self.gain, self.misses = 1.05, 0
        elif accepted > 0:
            self.misses = 0
            if self.gain >= 1.15:
                self.backoff = 4
        else:
            self.misses += 1
            if self.misses >= 3:
                self._pause()
                self.misses = 2


def accepted_len(d, out, i):
    a = 0
    while a < len(d) and i + a < len(out) and d[a] == out[i + a]:
        a += 1
    return a


def replay(prompt, out, row_cost, drafter):
    """drafter(toks, out, i, state) -> (draft, tokens the step pays for)."""
    toks, i, cost, steps = list(prompt) + [out[0]], 1, 0.0, 0
    st = State(MAX_DRAFT)
    while i < len(out):
        d, paid = drafter(toks, out, i, st)
        a = accepted_len(d, out, i)
        c = 1 + row_cost * paid(a, len(d))
        st.feedback(len(d), a, c)
        emitted = min(a + 1, len(out) - i)
        toks += out[i:i + emitted]
        i += emitted
        cost += c
        steps += 1
    n = len(out) - 1
    return n / cost, n / steps


def adaptive(cap):
    """The engine's drafter with rlai_spec_state, and the copy position
    (rlai_spec_near_after) kept across steps."""
    def run(toks, out, i, st):
        g = st.next_gamma()
        if g <= 0:
            return [], lambda a, k: k
        d, frm = draft_engine(toks, g, st.near, cap)
        a = accepted_len(d, out, i)
        if a > 0:
            st.near = frm + a + 1
        return d, lambda a, k: k
    return run


def len_oracle(toks, out, i, st):
    return draft_engine(toks, HARD_CAP, cap=False)[0], lambda a, k: a


def oracle(toks, out, i, st):
    n, best = len(toks), []
    for g in range(1, 9):
        suf = toks[n - g:]
        for j in range(n - g - 1, -1, -1):
            if toks[j:j + g] == suf:
                d = toks[j + g:j + g + HARD_CAP]
                if accepted_len(d, out, i) > accepted_len(best, out, i):
                    best = d
    return best, lambda a, k: a


def _branches(t, g, most):
    """Continuations of suffix matches (longest match first), at most
    `most`, each starting with a different token; each at most as long
    as its match unless the match is the longest (8)."""
    n, found, firsts = len(t), [], set()
    for L in range(8, 1, -1):
        suf = t[n - L:]
        for j in range(n - L - 1, -1, -1):
            if t[j:j + L] == suf:
                d = t[j + L:j + L + (g if L == 8 else min(g, L))]
                if d and d[0] not in firsts:
                    firsts.add(d[0])
                    found.append(d)
                    if len(found) >= most:
                        return found
    return found


def tree(most):
    def run(toks, out, i, st):
        g = st.next_gamma()
        if g <= 0:
            return [], lambda a, k: k
        bs = _branches(toks, g, most)
        if not bs:
            return [], lambda a, k: k
        best = max(bs, key=lambda d: accepted_len(d, out, i))
        rows = sum(len(d) for d in bs)
        return best, lambda a, k: rows
    return run


def expected_value(row_cost):
    """The engine's match, its length chosen by expected value: per
    (copying, match length 2 / 3-4 / 5-7 / 8, ambiguous 2-gram) cell the
    request learns how often a draft's first token is accepted and how
    often a later token is once the ones before it were (Beta(1, 1) and
    Beta(2, 1) priors), and drafts token j while the chance that tokens
    1..j are all accepted exceeds the row cost."""
    def make():
        stats, near = {}, [-1]

        def run(toks, out, i, st):
            m = longest_match(toks, near[0])
            if m is None:
                return [], lambda a, k: k
            L, frm, amb, cop = m
            cell = (cop, 0 if L == 2 else 1 if L <= 4 else 2 if L < 8 else 3, amb and L == 2)
            s = stats.setdefault(cell, [[1.0, 1.0], [2.0, 1.0]])
            p, k = 1.0, 0
            while k < min(len(toks) - frm, HARD_CAP):
                yes, no = s[0 if k == 0 else 1]
                p *= yes / (yes + no)
                if p <= row_cost:
                    break
                k += 1
            d = toks[frm:frm + k]
            a = accepted_len(d, out, i)
            for j in range(min(k, a + 1)):
                s[0 if j == 0 else 1][0 if j < a else 1] += 1
            if a > 0:
                near[0] = frm + a + 1
            return d, lambda a, k: k
        return run
    return make


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('ids', help='file written by bench_spec --dump')
    ap.add_argument('--row-cost', type=float, default=0.33)
    args = ap.parse_args()
    cases = load(args.ids)
    ev = expected_value(args.row_cost)
    drafters = [('engine', lambda: adaptive(True)), ('uncapped', lambda: adaptive(False)),
                ('len-oracle', lambda: len_oracle), ('oracle', lambda: oracle), ('tree2', lambda: tree(2)),
                ('ev', ev)]
    print(f"replayed speedup (tokens per step), row cost {args.row_cost}")
    print(f"{'case':6s}" + ''.join(f"{d:>18s}" for d, _ in drafters))
    per_case = {}   # case letter -> drafter -> [tokens, cost]
    for name, p, o in cases:
        row = ''
        for dn, make in drafters:
            sp, tps = replay(p, o, args.row_cost, make())
            row += f"{sp:11.2f}x ({tps:4.2f})"
            acc = per_case.setdefault(name[0], {}).setdefault(dn, [0, 0.0])
            acc[0] += len(o) - 1
            acc[1] += (len(o) - 1) / sp
        print(f"{name:6s}{row}")
    print("per case (its prompts together: their tokens over their cost)")
    for c, by in per_case.items():
        print((f"{c:6s}" + ''.join(f"{n / cost:11.2f}x{'':7s}" for n, cost in by.values())).rstrip())
    return 0


if __name__ == '__main__':
    sys.exit(main())
