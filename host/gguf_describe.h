/* gguf_describe.h - describes any GGUF file's header as JSON (the host's
 * gguf_describe for plugins, see include/rlai/plugin.h; used by fit).
 *
 * Only the header is parsed (the file is mapped, no tensor data is read),
 * with the engine's public validating reader (rlai/gguf.h). It works on files
 * the engine cannot run: vocabulary-only files, unknown architectures,
 * tensor types the engine cannot compute (their name is reported). */
#ifndef RLAI_HOST_GGUF_DESCRIBE_H
#define RLAI_HOST_GGUF_DESCRIBE_H

#include <stddef.h>

#include <cjson/cJSON.h>

/* Reads `path`'s header and sets *out to a new JSON object (owned by the
 * caller: cJSON_Delete) with:
 *   "arch", "name"                      general.architecture / general.name
 *   "n_layer", "n_embd", "n_head", "n_head_kv", "head_dim", "n_ff",
 *   "n_vocab", "n_ctx_train"            from "<arch>.*" keys; n_head_kv
 *                                       defaults to n_head, head_dim to
 *                                       attention.key_length or n_embd/n_head,
 *                                       n_vocab to <arch>.vocab_size, the
 *                                       tokenizer's token count or
 *                                       token_embd.weight's rows
 *   "n_params"                          sum of the tensors' element counts
 *   "weight_bytes"                      sum of the tensors' data bytes
 *   "tensor_types"                      {"<type name>": {"count", "params", "bytes"}}
 *   "file_bytes"                        size of the file
 * A field whose key is missing (or has a wrong type) is absent, never an
 * error. Returns 0, or a negative rlai_error with a message in err (if
 * errlen > 0): the reader's (RLAI_ERR_IO, RLAI_ERR_FORMAT, RLAI_ERR_UNSUPPORTED
 * for a tensor type id without a known size), RLAI_ERR_INVALID_ARG for NULL
 * arguments, RLAI_ERR_NOMEM. *out is NULL on failure. Thread-safe. */
int rlai_host_gguf_describe(const char *path, cJSON **out, char *err, size_t errlen);

#endif
