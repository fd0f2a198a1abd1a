/* fuzz_sse.c - libFuzzer target for the SSE parser (host/sse.c) and the
 * upstream chunk decoder (host/upstream.c).
 *
 * The input (after its first byte) is parsed twice: in one feed, and in
 * pieces whose sizes come from the first byte. Both must give the same
 * events (the parser is split-invariant) and the same result. Each event's
 * data goes through rlai_upstream_parse_chunk, which must return a known
 * code and leave nothing allocated but its text. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "sse.h"
#include "upstream.h"
#include "rlai/error.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct log {
    unsigned char *p;
    size_t len, cap;
} log_t;

static int on_event(void *user, const char *event, const char *d, size_t len)
{
    log_t *l = user;
    size_t el = strlen(event);
    if (strlen(d) > len)
        abort();
    size_t need = l->len + el + len + 2;
    if (need > l->cap) {
        size_t cap = need * 2;
        unsigned char *q = realloc(l->p, cap);
        if (!q)
            abort();
        l->p = q;
        l->cap = cap;
    }
    memcpy(l->p + l->len, event, el);
    l->len += el;
    l->p[l->len++] = 0;
    memcpy(l->p + l->len, d, len);
    l->len += len;
    l->p[l->len++] = 0;
    rlai_upstream_delta dl;
    char msg[128];
    int rc = rlai_upstream_parse_chunk(d, len, &dl, msg, sizeof msg);
    if (rc != 0 && rc != 1 && rc != RLAI_ERR_FORMAT && rc != RLAI_ERR_DISCONNECTED && rc != RLAI_ERR_NOMEM)
        abort();
    if (dl.text && strlen(dl.text) != dl.len)
        abort();
    if ((dl.logprobs && (rc != 0 || !cJSON_IsArray(dl.logprobs))) ||
        (dl.tool_calls && (rc != 0 || !cJSON_IsArray(dl.tool_calls))))
        abort();
    free(dl.text);
    cJSON_Delete(dl.logprobs);
    cJSON_Delete(dl.tool_calls);
    return 0;
}

static int run(const uint8_t *d, size_t n, size_t step, log_t *l)
{
    rlai_sse *p = NULL;
    if (rlai_sse_new(4096, on_event, l, &p) != 0)
        abort();
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i += step) {
        size_t k = n - i < step ? n - i : step;
        rc = rlai_sse_feed(p, (const char *)d + i, k);
    }
    int pend = rlai_sse_pending(p);
    rlai_sse_free(p);
    return rc * 2 + (pend ? 1 : 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t step = (size_t)(data[0] % 17) + 1;
    /* exact-size copy: reads past the end are caught by ASan */
    size_t n = size - 1;
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf)
        return 0;
    memcpy(buf, data + 1, n);
    log_t a = { 0 }, b = { 0 };
    int ra = run(buf, n, n ? n : 1, &a);
    int rb = run(buf, n, step, &b);
    /* a too-long line may be detected at another event boundary only when
     * the result is an error; without one the events must be the same */
    if (ra >= 0 && rb >= 0 && (ra != rb || a.len != b.len || (a.len && memcmp(a.p, b.p, a.len))))
        abort();
    free(a.p);
    free(b.p);
    free(buf);
    return 0;
}
