/* rlai_logits.c - test tool for the reference comparison (tests/ref/).
 *
 *   rlai-logits MODEL [--precise] [--isa I] [--threads N] [--device D] --tokens "ID ..." --out FILE
 *       writes the logits of every position: n * n_vocab float32 LE, row-major
 *   rlai-logits MODEL [opts] --tokens "ID ..." --greedy N
 *       prints N greedily generated ids (EOS does not stop generation)
 *   rlai-logits MODEL [opts] --tokens "ID ..." --embed mean|last --out FILE
 *       writes the pooled, L2-normalised final-norm hidden state: n_embd float32 LE
 *   rlai-logits MODEL --tokenize "TEXT"
 *       prints the prompt ids (special tokens parsed, BOS if the model wants it)
 * Exit status 0 on success, 1 with a message on stderr otherwise. */
#include "rlai/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse_ids(const char *s, rlai_token **out, int *n_out)
{
    int cap = 16, n = 0;
    rlai_token *ids = malloc(sizeof(rlai_token) * (size_t)cap);
    if (!ids)
        return -1;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s) {
            if (*s == ' ' || *s == ',') {
                s++;
                continue;
            }
            free(ids);
            return -1;
        }
        if (n == cap) {
            cap *= 2;
            rlai_token *t = realloc(ids, sizeof(rlai_token) * (size_t)cap);
            if (!t) {
                free(ids);
                return -1;
            }
            ids = t;
        }
        ids[n++] = (rlai_token)v;
        s = end;
    }
    *out = ids;
    *n_out = n;
    return 0;
}

typedef struct greedy_state { int printed; } greedy_state;

static int print_cb(void *user, rlai_token tok, const char *text, size_t len)
{
    (void)text;
    (void)len;
    greedy_state *g = user;
    if (tok >= 0)
        printf(g->printed++ ? " %d" : "%d", tok);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: rlai-logits MODEL [--precise] [--isa I] [--threads N] [--device D] "
                        "(--tokens IDS (--out FILE | --greedy N) | --tokenize TEXT)\n");
        return 1;
    }
    rlai_engine_params ep;
    rlai_engine_params_init(&ep);
    const char *tokens = NULL, *outfile = NULL, *text = NULL;
    int greedy = 0;
    const char *embed = NULL;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--precise")) {
            ep.precise = true;
        } else if (!strcmp(a, "--isa") && v) {
            i++;
            if (!strcmp(v, "auto")) ep.isa = RLAI_ISA_AUTO;
            else if (!strcmp(v, "scalar")) ep.isa = RLAI_ISA_SCALAR;
            else if (!strcmp(v, "avx2")) ep.isa = RLAI_ISA_AVX2;
            else if (!strcmp(v, "avx512")) ep.isa = RLAI_ISA_AVX512;
            else { fprintf(stderr, "bad --isa %s\n", v); return 1; }
        } else if (!strcmp(a, "--device") && v) {
            ep.device = v;
            i++;
        } else if (!strcmp(a, "--kv") && v) {
            ep.kv_type = !strcmp(v, "q8_0") ? RLAI_KV_Q8_0 : RLAI_KV_F16;
            i++;
        } else if (!strcmp(a, "--threads") && v) {
            ep.n_threads = atoi(v);
            i++;
        } else if (!strcmp(a, "--tokens") && v) {
            tokens = v;
            i++;
        } else if (!strcmp(a, "--out") && v) {
            outfile = v;
            i++;
        } else if (!strcmp(a, "--greedy") && v) {
            greedy = atoi(v);
            i++;
        } else if (!strcmp(a, "--embed") && v) {
            embed = v;
            i++;
        } else if (!strcmp(a, "--tokenize") && v) {
            text = v;
            i++;
        } else {
            fprintf(stderr, "rlai-logits: bad argument '%s'\n", a);
            return 1;
        }
    }
    rlai_engine *e;
    char err[768];
    int rc = rlai_engine_open(argv[1], &ep, &e, err, sizeof(err));
    if (rc < 0) {
        fprintf(stderr, "rlai-logits: %s\n", err);
        return 1;
    }
    int status = 1;
    rlai_token *ids = NULL;
    float *logits = NULL;
    if (text) {
        int n = rlai_engine_tokenize(e, text, strlen(text), true, true, NULL, 0);
        if (n < 0) {
            fprintf(stderr, "rlai-logits: tokenize: %s\n", rlai_strerror(n));
            goto out;
        }
        ids = malloc(sizeof(rlai_token) * (size_t)(n + 1));
        if (!ids)
            goto out;
        n = rlai_engine_tokenize(e, text, strlen(text), true, true, ids, n);
        for (int i = 0; i < n; i++)
            printf(i ? " %d" : "%d", ids[i]);
        printf("\n");
        status = 0;
        goto out;
    }
    int n;
    if (!tokens || parse_ids(tokens, &ids, &n) < 0 || n == 0) {
        fprintf(stderr, "rlai-logits: --tokens missing or invalid\n");
        goto out;
    }
    if (greedy > 0) {
        rlai_gen_params gp;
        rlai_gen_params_init(&gp);
        gp.max_tokens = greedy;
        gp.ignore_eos = true;
        greedy_state gs = { 0 };
        rc = rlai_engine_generate_tokens(e, ids, n, &gp, print_cb, &gs, NULL);
        printf("\n");
        if (rc < 0) {
            fprintf(stderr, "rlai-logits: generate: %s\n", rlai_strerror(rc));
            goto out;
        }
        status = 0;
        goto out;
    }
    if (!outfile) {
        fprintf(stderr, "rlai-logits: --out or --greedy required\n");
        goto out;
    }
    rlai_model_info mi;
    rlai_engine_info(e, &mi);
    if (embed) {
        rlai_pooling pool = !strcmp(embed, "last") ? RLAI_POOL_LAST : RLAI_POOL_MEAN;
        logits = malloc(sizeof(float) * (size_t)mi.n_embd);
        if (!logits)
            goto out;
        rc = rlai_engine_embed(e, ids, n, pool, true, logits);
        if (rc < 0) {
            fprintf(stderr, "rlai-logits: embed: %s\n", rlai_strerror(rc));
            goto out;
        }
        FILE *ef = fopen(outfile, "wb");
        if (!ef || fwrite(logits, sizeof(float), (size_t)mi.n_embd, ef) != (size_t)mi.n_embd) {
            fprintf(stderr, "rlai-logits: cannot write %s\n", outfile);
            if (ef)
                fclose(ef);
            goto out;
        }
        fclose(ef);
        status = 0;
        goto out;
    }
    logits = malloc(sizeof(float) * (size_t)n * (size_t)mi.n_vocab);
    if (!logits) {
        fprintf(stderr, "rlai-logits: out of memory\n");
        goto out;
    }
    rc = rlai_engine_eval_logits(e, ids, n, logits);
    if (rc < 0) {
        fprintf(stderr, "rlai-logits: eval: %s\n", rlai_strerror(rc));
        goto out;
    }
    FILE *f = fopen(outfile, "wb");
    if (!f || fwrite(logits, sizeof(float), (size_t)n * (size_t)mi.n_vocab, f) != (size_t)n * (size_t)mi.n_vocab) {
        fprintf(stderr, "rlai-logits: cannot write %s\n", outfile);
        if (f)
            fclose(f);
        goto out;
    }
    fclose(f);
    status = 0;
out:
    free(ids);
    free(logits);
    rlai_engine_close(e);
    return status;
}
