#!/usr/bin/env python3
"""self_draft_probe.py - would drafting with a subset of the model's own
blocks (self-speculative layer skipping) be accepted?

    build/bench/bench_spec --reps 1 --dump /tmp/spec.ids
    .venv/bin/python3 bench/self_draft_probe.py /tmp/spec.ids [--cases a1,c1]

For each output position of the chosen bench_spec prompts it runs the
reference forward pass (tests/ref/ref_model.py, activations rounded to
int8 like the engine's kernels) of the full model and of drafts that keep
only some blocks, and prints how often the draft's greedy token is the
full model's:

  shared    the Draft & Verify arrangement: the draft token attends, in each
            kept block, to the full model's exact K/V of every earlier
            position (the target's own cache, no second cache and no
            catch-up), only its own row is approximate
  separate  a draft with its own cache, the skipped model run over the
            whole prompt and output (what `--draft-model` with a GGUF of
            the kept blocks measures in the engine)

Only the first draft token is probed (later tokens of a draft also see the
draft's approximate rows, so they are accepted less often). A draft block
costs about what a target block costs, and the output head (a third of the
default model's bytes) runs in full for every draft token, so a draft of
k of 30 blocks costs about (0.67 * k / 30 + 0.33) of a decode step.
"""
import argparse
import copy
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "ref"))
from ref_model import KVCache, RefModel  # noqa: E402


def subsets(n_layer):
    """Blocks kept: the sets of the 2026-12-06 engine runs plus a few."""
    every2 = [0, 1, 2, 3] + list(range(5, n_layer - 4, 2)) + list(range(n_layer - 4, n_layer))
    return {
        "all but 10,14,18,22": [i for i in range(n_layer) if i not in (10, 14, 18, 22)],
        "all but 24-28": [i for i in range(n_layer) if i not in range(24, 29)],
        "0-21 and 29": list(range(22)) + [n_layer - 1],
        "0-3, odd 5-25, 26-29": every2,
    }


def sub_model(m, keep):
    s = copy.copy(m)
    s.layers = [m.layers[i] for i in keep]
    s.n_layer = len(keep)
    return s


def probe(m, prompt, out, keep, full, target):
    """(shared, separate) share of positions where the draft's first token
    is the full model's; full: the full model's cache of prompt + out[:-1],
    target: its greedy tokens for the output positions."""
    seq = prompt + out[:-1]
    P, T = len(prompt), len(seq)
    d = sub_model(m, keep)
    separate = d.forward(seq)[P - 1:].argmax(-1)
    shared = []
    for p in range(P - 1, T):
        c = KVCache(k=[full.k[i][:p] for i in keep], v=[full.v[i][:p] for i in keep], n=p)
        shared.append(d.forward([seq[p]], c, last_only=True).argmax())
    return float(np.mean(np.array(shared) == target)), float(np.mean(separate == target))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dump", help="bench_spec --dump file")
    ap.add_argument("--model", default=os.path.join(HERE, "..", "models",
                                                     "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--cases", default="a1,b1,c1,c2,c3,d1")
    a = ap.parse_args()
    want = a.cases.split(",")
    m = RefModel(a.model, act_q8=True)
    sets = subsets(m.n_layer)
    print("first draft token = full model's greedy token, shared / separate cache")
    print("prompt  ref=engine  " + "  ".join(f"{k} ({len(v)})" for k, v in sets.items()))
    with open(a.dump) as f:
        for line in f:
            name, rest = line.split(" ", 1)
            if name not in want:
                continue
            p, o = rest.split("|")
            prompt, out = [int(x) for x in p.split()], [int(x) for x in o.split()]
            full = m.new_cache()
            target = m.forward(prompt + out[:-1], full)[len(prompt) - 1:].argmax(-1)
            same = float(np.mean(target == np.array(out)))
            cols = []
            for keep in sets.values():
                sh, se = probe(m, prompt, out, keep, full, target)
                cols.append(f"{sh * 100:3.0f}% / {se * 100:3.0f}%")
            print(f"{name:6}  {same * 100:9.0f}%  " + "  ".join(cols), flush=True)


if __name__ == "__main__":
    main()
