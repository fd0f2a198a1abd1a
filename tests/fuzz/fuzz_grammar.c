/* fuzz_grammar.c - libFuzzer target for the JSON Schema compiler and the
 * byte matcher (engine/grammar.c), which take schemas from HTTP and wire
 * clients (response_format, tools).
 *
 * Input: flags byte, then the schema text up to the first NUL, then text
 * fed to a matcher in pieces whose sizes come from the flags byte. A schema
 * is compiled or refused with a known code and a message. The text is fed
 * until a piece is refused (the state must then be unchanged: feeding the
 * rest of the accepted prefix again gives the same answers). After each
 * piece the forced text is asked for; it must be the only continuation: a
 * second matcher fed everything accepted so far accepts the forced bytes,
 * cannot end before their last byte, and refuses other bytes in their
 * place (three of them are tried at each position). A byte that would open
 * more alternatives than a matcher state holds (G_MAX_HEADS) is an error
 * (RLAI_ERR_TOO_LARGE) that leaves the state as it was. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rlai/error.h"
#include "rlai/grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_forced(const rlai_grammar *g, const char *fed, size_t n_fed, const char *forced, int nf)
{
    rlai_grammar_matcher *m = NULL;
    if (rlai_grammar_matcher_new(g, &m) < 0)
        return;   /* out of memory: nothing to compare */
    if (rlai_grammar_matcher_feed(m, fed, n_fed) != 0)
        abort();   /* the same bytes were accepted by the first matcher */
    for (int i = 0; i < nf; i++) {
        if (rlai_grammar_matcher_can_end(m))
            abort();   /* forced text stops where the text could end */
        /* no other byte continues it (a sample of them: a refused byte
         * leaves the state as it was) */
        const char alt[3] = { (char)(forced[i] ^ 1), (char)(forced[i] ^ 0x20), ' ' };
        for (int k = 0; k < 3; k++) {
            if (alt[k] == forced[i])
                continue;
            /* (or a byte into more open alternatives than a state holds:
             * an error, never offered) */
            int frc = rlai_grammar_matcher_feed(m, alt + k, 1);
            if (frc != RLAI_ERR_INVALID_ARG && frc != RLAI_ERR_TOO_LARGE)
                abort();
        }
        if (rlai_grammar_matcher_feed(m, forced + i, 1) != 0)
            abort();   /* every forced byte continues the text */
    }
    rlai_grammar_matcher_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    unsigned flags = data[0];
    const char *s = (const char *)data + 1;
    size_t rest = size - 1;
    const char *nul = memchr(s, 0, rest);
    size_t slen = nul ? (size_t)(nul - s) : rest;
    const char *text = nul ? nul + 1 : s + rest;
    size_t tlen = nul ? rest - slen - 1 : 0;

    rlai_grammar *g = NULL;
    char err[256];
    err[0] = 0;
    int rc = rlai_grammar_from_json_schema_flags(s, slen, (flags & 1) ? RLAI_GRAMMAR_OR_TEXT : 0, &g, err,
                                                 sizeof(err));
    if (rc < 0) {
        if (g || (rc != RLAI_ERR_INVALID_ARG && rc != RLAI_ERR_UNSUPPORTED && rc != RLAI_ERR_TOO_LARGE &&
                  rc != RLAI_ERR_NOMEM) || (rc != RLAI_ERR_NOMEM && !err[0]))
            abort();
        return 0;
    }
    if (!g)
        abort();
    rlai_grammar_matcher *m = NULL;
    if (rlai_grammar_matcher_new(g, &m) < 0) {
        rlai_grammar_unref(g);
        return 0;
    }
    size_t piece = 1 + (flags >> 1) % 7, fed = 0;
    char forced[64];
    for (;;) {
        int nf = rlai_grammar_matcher_forced(m, forced, (int)sizeof(forced));
        if (nf < 0) {
            if (nf != RLAI_ERR_NOMEM)
                abort();
        } else {
            if (nf > (int)sizeof(forced))
                abort();
            check_forced(g, text, fed, forced, nf);
        }
        if (fed >= tlen)
            break;
        size_t n = tlen - fed < piece ? tlen - fed : piece;
        int frc = rlai_grammar_matcher_feed(m, text + fed, n);
        if (frc == RLAI_ERR_INVALID_ARG) {
            /* refused: the state is the one before the piece */
            bool end = rlai_grammar_matcher_can_end(m);
            rlai_grammar_matcher *m2 = NULL;
            if (rlai_grammar_matcher_new(g, &m2) == 0) {
                if (rlai_grammar_matcher_feed(m2, text, fed) != 0 || rlai_grammar_matcher_can_end(m2) != end)
                    abort();
                rlai_grammar_matcher_free(m2);
            }
            break;
        }
        if (frc != 0) {
            if (frc != RLAI_ERR_NOMEM && frc != RLAI_ERR_TOO_LARGE)
                abort();
            break;
        }
        fed += n;
    }
    /* a text fed whole and complete is accepted in one call, and conversely */
    if (fed == tlen && rlai_grammar_matcher_can_end(m) != rlai_grammar_accepts(g, text, tlen))
        abort();
    rlai_grammar_matcher_free(m);
    rlai_grammar_unref(g);
    return 0;
}
