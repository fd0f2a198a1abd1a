/* vocab.c - rlai_vocab: the tokenizer of a GGUF file without its weights
 * (see rlai/vocab.h). */
#include "rlai/vocab.h"
#include "rlai/error.h"
#include "rlai/gguf.h"
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>

struct rlai_vocab {
    rlai_tokenizer *tok;
};

int rlai_vocab_open(const char *path, rlai_vocab **out, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    if (!out)
        return RLAI_ERR_INVALID_ARG;
    *out = NULL;
    if (!path) {
        if (err && errlen)
            snprintf(err, errlen, "no model path given");
        return RLAI_ERR_INVALID_ARG;
    }
    rlai_gguf *g = NULL;
    int rc = rlai_gguf_open_file(path, &g, err, errlen);
    if (rc < 0)
        return rc;
    rlai_vocab *v = calloc(1, sizeof(*v));
    if (!v) {
        rlai_gguf_close(g);
        return RLAI_ERR_NOMEM;
    }
    /* the tokenizer copies what it needs, so the file is closed at once */
    rc = rlai_tokenizer_load(g, &v->tok, err, errlen);
    rlai_gguf_close(g);
    if (rc < 0) {
        free(v);
        return rc;
    }
    *out = v;
    return 0;
}

void rlai_vocab_close(rlai_vocab *v)
{
    if (!v)
        return;
    rlai_tokenizer_free(v->tok);
    free(v);
}

int rlai_vocab_n_tokens(const rlai_vocab *v)
{
    return v ? rlai_tokenizer_n_vocab(v->tok) : RLAI_ERR_INVALID_ARG;
}

int rlai_vocab_tokenize(const rlai_vocab *v, const char *text, size_t len, bool add_special,
                        bool parse_special, int32_t *out, int cap)
{
    if (!v || (!text && len) || cap < 0 || (cap > 0 && !out))
        return RLAI_ERR_INVALID_ARG;
    return rlai_tokenizer_encode(v->tok, text ? text : "", len, add_special, parse_special, out, cap);
}
