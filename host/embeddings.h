/* embeddings.h - POST /v1/embeddings for the HTTP front (docs/SERVE.md).
 *
 * input: a string, a list of strings, a list of token ids or a list of
 * such lists (at most RLAI_EMBED_MAX_INPUTS). Each input is embedded on its
 * own with rlai_engine_embed: the final-norm hidden state (before the LM
 * head), mean-pooled over the input's positions (extension "pooling":
 * "last" takes the last position's), L2-normalised. Strings are tokenized
 * with BOS as the model wants it and special-token text NOT parsed.
 * encoding_format "float" (default) or "base64" (little-endian float32);
 * "dimensions" is accepted only when it equals the model's width. */
#ifndef RLAI_HOST_EMBEDDINGS_H
#define RLAI_HOST_EMBEDDINGS_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include "rlai/engine.h"

#define RLAI_EMBED_MAX_INPUTS 2048

typedef struct rlai_embed_error {
    const char *code;       /* OpenAI error code or NULL (static) */
    const char *param;      /* offending field or NULL (static) */
    char msg[300];
} rlai_embed_error;

/* Answers one request body (borrowed). max_tokens caps each input's
 * length. On success returns 200 and *out owns the response object; else
 * returns the HTTP status (400, 413, 429, 500), *out = NULL and *err says
 * why. *n_tokens receives the prompt tokens embedded (usage). */
int rlai_embeddings_answer(rlai_engine *e, const cJSON *body, const char *model, int max_tokens, cJSON **out,
                           int *n_tokens, rlai_embed_error *err);

#endif
