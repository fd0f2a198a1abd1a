/* embed.c - the smallest program that embeds the engine (the C embed API,
 * <rlai/engine.h>, linked from the installed librlai):
 *
 *     cc embed.c $(pkg-config --cflags --libs rlai) -o embed
 *     ./embed MODEL.gguf "Write a haiku about the sea." [MAX_TOKENS]
 *
 * Opens the model, formats the prompt with the model's chat template,
 * generates greedily and streams the text to stdout, then prints the
 * metrics to stderr. Every error is a negative code with rlai_strerror(). */
#include <rlai/engine.h>

#include <stdio.h>
#include <stdlib.h>

static int on_token(void *user, rlai_token tok, const char *text, size_t len)
{
    (void)user;
    (void)tok;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0;   /* 0 = go on */
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL.gguf PROMPT [MAX_TOKENS]\n", argv[0]);
        return 2;
    }
    rlai_engine_params ep;
    rlai_engine_params_init(&ep);
    rlai_engine *e = NULL;
    char err[512];
    int rc = rlai_engine_open(argv[1], &ep, &e, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "cannot open %s: %s (%s)\n", argv[1], err, rlai_strerror(rc));
        return 1;
    }
    rlai_chat_message msg = { "user", argv[2] };
    rlai_token *toks = NULL;
    int n = 0;
    rc = rlai_engine_tokenize_chat(e, &msg, 1, true, &toks, &n);   /* toks: malloc'd, ours */
    rlai_gen_params gp;
    rlai_gen_params_init(&gp);
    gp.sampling.temperature = 0;   /* greedy: the same text every run */
    gp.max_tokens = argc > 3 ? atoi(argv[3]) : 64;
    rlai_gen_metrics m;
    if (rc == 0)
        rc = rlai_engine_generate_tokens(e, toks, n, &gp, on_token, NULL, &m);
    free(toks);
    if (rc < 0) {
        fprintf(stderr, "generation failed: %s\n", rlai_strerror(rc));
        rlai_engine_close(e);
        return 1;
    }
    printf("\n");
    fprintf(stderr, "prompt %d tokens, generated %d tokens, decode %.1f tok/s\n", m.prompt_tokens, m.gen_tokens,
            m.decode_tps);
    rlai_engine_close(e);
    return 0;
}
