/* rlai/vocab.h - a GGUF file's tokenizer without its weights: for tools
 * that only tokenize (`rlai tokenize`), and for vocabulary-only GGUF files
 * (tests/data/tokenizer/ggml-vocab-*.gguf) that rlai_engine_open refuses.
 * The ids equal those of rlai_engine_tokenize on the same model. */
#ifndef RLAI_VOCAB_H
#define RLAI_VOCAB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rlai_vocab rlai_vocab;

/* Reads the tokenizer.* keys of the GGUF at `path` (the file is mapped,
 * validated, read and unmapped again; no tensor data is read). On success
 * *out is owned by the caller (rlai_vocab_close). On failure returns the
 * reader's or the tokenizer's error (RLAI_ERR_IO, RLAI_ERR_FORMAT,
 * RLAI_ERR_UNSUPPORTED, RLAI_ERR_NOMEM, RLAI_ERR_INVALID_ARG) with a
 * message in err (if errlen > 0) and sets *out to NULL. */
int rlai_vocab_open(const char *path, rlai_vocab **out, char *err, size_t errlen);

/* Frees the vocabulary. Accepts NULL. */
void rlai_vocab_close(rlai_vocab *v);

/* Number of tokens. */
int rlai_vocab_n_tokens(const rlai_vocab *v);

/* Tokenizes `len` bytes of `text` (caller-owned). add_special: BOS/EOS as
 * the model's metadata asks; parse_special: special-token text becomes its
 * id. Writes at most cap ids to out (may be NULL with cap 0) and returns
 * the total count (may exceed cap), or a negative error. Thread-safe. */
int rlai_vocab_tokenize(const rlai_vocab *v, const char *text, size_t len, bool add_special,
                        bool parse_special, int32_t *out, int cap);

#ifdef __cplusplus
}
#endif
#endif
