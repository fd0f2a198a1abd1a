"""Write draft-model GGUFs derived from a llama-family GGUF (speculative
decoding tests and bench_spec).

    python3 make_draft.py SRC.gguf OUT_DIR [STAMP]

Writes into OUT_DIR:

- ``layers8.gguf``: the first 8 transformer blocks of SRC with its token
  embedding, final norm and tokenizer (an early-exit model: a real, cheaper
  and different model with the same vocabulary, so some drafts are
  rejected);
- ``badvocab.gguf``: the same with one token's text changed (a draft with
  another tokenizer must be refused at load);
- with ``--f16`` also ``f16.gguf``: every quantized matrix of SRC
  dequantized and stored as F16 (the same model at about 3x the bytes per
  token, a stand-in target for bench_spec when no larger model of the
  family is at hand).

Only the gguf and numpy packages are used (scripts/setup.sh installs them).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import gguf
import gguf.quants

V = gguf.GGUFValueType
T = gguf.GGMLQuantizationType


def field_value(f):
    """(value, vtype, sub_type) of a reader field for GGUFWriter.add_key_value."""
    vtype = f.types[0]
    if vtype == V.ARRAY:
        return list(f.contents()), vtype, f.types[1]
    return f.contents(), vtype, None


def copy_model(src: gguf.GGUFReader, out: Path, n_layers=None, vocab_edit=None, to_f16=False):
    arch = src.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(out), arch)
    for key, f in src.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        val, vtype, sub = field_value(f)
        if n_layers is not None and key == f"{arch}.block_count":
            val = n_layers
        if vocab_edit is not None and key == "tokenizer.ggml.tokens":
            idx, text = vocab_edit
            val = list(val)
            val[idx] = text
        if to_f16 and key == "general.file_type":
            val = 1
        w.add_key_value(key, val, vtype, sub)
    for t in src.tensors:
        if n_layers is not None and t.name.startswith("blk.") and int(t.name.split(".")[1]) >= n_layers:
            continue
        shape = [int(x) for x in reversed(t.shape.tolist())]    # numpy order
        if to_f16 and t.tensor_type not in (T.F32, T.F16):
            data = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float16)
            w.add_tensor(t.name, data)
        else:
            w.add_tensor(t.name, t.data, raw_shape=t.data.shape if t.tensor_type in (T.F32, T.F16) else None,
                         raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main(argv):
    f16 = "--f16" in argv
    argv = [a for a in argv if a != "--f16"]
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    src = gguf.GGUFReader(argv[0])
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    copy_model(src, out / "layers8.gguf", n_layers=8)
    copy_model(src, out / "badvocab.gguf", n_layers=8, vocab_edit=(300, "#draft#"))
    if f16:
        copy_model(src, out / "f16.gguf", to_f16=True)
    if len(argv) > 2:
        Path(argv[2]).write_text("ok\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
