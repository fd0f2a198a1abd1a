#!/usr/bin/env python3
"""Writes the small seed corpus for fuzz_gguf into corpus/gguf/ (each < 4 KB).

Run from anywhere: python3 tests/fuzz/make_seeds.py
"""
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "gguf")


def u32(v): return struct.pack("<I", v)
def u64(v): return struct.pack("<Q", v)
def s(t): b = t.encode(); return u64(len(b)) + b
def kv(key, vt, payload): return s(key) + u32(vt) + payload


def tensor(name, ne, ty, off):
    return s(name) + u32(len(ne)) + b"".join(u64(n) for n in ne) + u32(ty) + u64(off)


def gguf(kvs, tensors=(), data=b"", align=32, version=3):
    head = b"GGUF" + u32(version) + u64(len(tensors)) + u64(len(kvs)) + b"".join(kvs)
    head += b"".join(tensors)
    if tensors:
        head += b"\0" * ((align - len(head) % align) % align) + data
    return head


def main():
    os.makedirs(OUT, exist_ok=True)
    kvs = [
        kv("general.architecture", 8, s("llama")),
        kv("general.alignment", 4, u32(32)),
        kv("llama.block_count", 4, u32(1)),
        kv("llama.rope.freq_base", 6, struct.pack("<f", 10000.0)),
        kv("tokenizer.ggml.add_bos_token", 7, b"\1"),
        kv("tokenizer.ggml.tokens", 9, u32(8) + u64(3) + s("<s>") + s("a") + s("b")),
        kv("tokenizer.ggml.scores", 9, u32(6) + u64(3) + struct.pack("<3f", 0, -1, -2)),
        kv("t.nested", 9, u32(9) + u64(1) + u32(0) + u64(2) + b"\1\2"),
        kv("t.i64", 11, struct.pack("<q", -5)),
        kv("t.f64", 12, struct.pack("<d", 0.5)),
    ]
    ts = [
        tensor("token_embd.weight", [32, 2], 8, 0),   # Q8_0, 68 bytes
        tensor("output_norm.weight", [32], 0, 96),    # F32, 128 bytes
        tensor("blk.0.ffn_up.weight", [32, 1], 3, 224),  # Q4_1, 20 bytes
    ]
    data = bytes((i * 7 + 1) & 0xFF for i in range(244))
    valid = gguf(kvs, ts, data)
    seeds = {
        "valid_model.gguf": valid,
        "vocab_only_v2.gguf": gguf(kvs[:1] + kvs[4:7], version=2),
        "truncated.gguf": valid[: len(valid) // 2],
        "bad_version.gguf": gguf(kvs[:2], version=1),
        "overlap.gguf": gguf(kvs[:1], [tensor("a", [32], 0, 0), tensor("b", [8], 0, 64)],
                             bytes(160)),
    }
    for name, blob in seeds.items():
        assert len(blob) < 4096
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(blob)


if __name__ == "__main__":
    main()
