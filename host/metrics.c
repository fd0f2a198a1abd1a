/* metrics.c - daemon metrics in Prometheus text format (see metrics.h). */
#include "metrics.h"
#include "rlai/error.h"
#include "rlai/strbuf.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PAIRS 64
#define MAX_TRANSPORTS 8
#define MAX_CODES 32
#define LABEL_MAX 32

/* Histogram upper bounds (the +Inf bucket is implicit). */
/* seconds (Prometheus convention: durations in base units) */
static const double ttft_bounds[] = { 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30 };
#define N_TTFT (sizeof(ttft_bounds) / sizeof(ttft_bounds[0]))
static const double tps_bounds[] = { 1, 5, 10, 25, 50, 100, 150, 200, 300, 500, 1000, 2000 };
#define N_TPS (sizeof(tps_bounds) / sizeof(tps_bounds[0]))

typedef struct histogram {
    uint64_t buckets[16];      /* non-cumulative counts; [n_bounds] is +Inf */
    uint64_t count;
    double sum;
} histogram;

typedef struct pair_counter {
    char endpoint[LABEL_MAX], transport[LABEL_MAX];
    uint64_t n;
} pair_counter;

typedef struct transport_stats {
    char name[LABEL_MAX];
    uint64_t generations, errors, prompt_tokens, reused_tokens, gen_tokens, drafted_tokens, accepted_tokens;
    histogram ttft, tps;
} transport_stats;

struct rlai_metrics {
    pthread_mutex_t mu;
    pair_counter pairs[MAX_PAIRS];
    int n_pairs;
    transport_stats tr[MAX_TRANSPORTS];
    int n_tr;
    struct { int code; uint64_t n; } codes[MAX_CODES];
    int n_codes;
    struct { char command[LABEL_MAX * 2]; uint64_t n; } timeouts[MAX_PAIRS];
    int n_timeouts;
    struct { char command[LABEL_MAX * 2]; char transport[LABEL_MAX]; uint64_t n; } calls[MAX_PAIRS];
    int n_calls;
    int workers_stuck;
};

int rlai_metrics_new(rlai_metrics **out)
{
    *out = NULL;
    rlai_metrics *m = calloc(1, sizeof(*m));
    if (!m)
        return RLAI_ERR_NOMEM;
    pthread_mutex_init(&m->mu, NULL);
    *out = m;
    return 0;
}

void rlai_metrics_free(rlai_metrics **self_p)
{
    if (!self_p || !*self_p)
        return;
    pthread_mutex_destroy(&(*self_p)->mu);
    free(*self_p);
    *self_p = NULL;
}

/* Copies a label, keeping only [A-Za-z0-9_.-/] so the output stays valid. */
static void copy_label(char *dst, const char *src)
{
    size_t i = 0;
    for (; src && src[i] && i < LABEL_MAX - 1; i++) {
        char c = src[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '_' || c == '.' || c == '-' || c == '/';
        dst[i] = ok ? c : '_';
    }
    dst[i] = 0;
}

void rlai_metrics_count_request(rlai_metrics *m, const char *endpoint, const char *transport)
{
    if (!m)
        return;
    char ep[LABEL_MAX], tr[LABEL_MAX];
    copy_label(ep, endpoint);
    copy_label(tr, transport);
    pthread_mutex_lock(&m->mu);
    pair_counter *slot = NULL;
    for (int i = 0; i < m->n_pairs && !slot; i++)
        if (!strcmp(m->pairs[i].endpoint, ep) && !strcmp(m->pairs[i].transport, tr))
            slot = &m->pairs[i];
    if (!slot && m->n_pairs < MAX_PAIRS - 1) {
        slot = &m->pairs[m->n_pairs++];
        memcpy(slot->endpoint, ep, sizeof(ep));
        memcpy(slot->transport, tr, sizeof(tr));
    }
    if (!slot) {
        /* The last slot is reserved for everything that did not fit. */
        slot = &m->pairs[MAX_PAIRS - 1];
        if (m->n_pairs < MAX_PAIRS) {
            m->n_pairs = MAX_PAIRS;
            strcpy(slot->endpoint, "other");
            strcpy(slot->transport, "other");
        }
    }
    slot->n++;
    pthread_mutex_unlock(&m->mu);
}

void rlai_metrics_count_plugin_timeout(rlai_metrics *m, const char *command)
{
    if (!m)
        return;
    char name[LABEL_MAX * 2];
    size_t i = 0;
    for (; command && command[i] && i < sizeof(name) - 1; i++) {
        char c = command[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '.';
        name[i] = ok ? c : '_';
    }
    name[i] = 0;
    pthread_mutex_lock(&m->mu);
    int k = 0;
    while (k < m->n_timeouts && strcmp(m->timeouts[k].command, name) != 0)
        k++;
    if (k == m->n_timeouts) {
        if (m->n_timeouts < MAX_PAIRS - 1) {
            m->n_timeouts++;
        } else {
            /* the last slot is for everything that did not fit */
            k = MAX_PAIRS - 1;
            snprintf(name, sizeof(name), "other");
            if (m->n_timeouts < MAX_PAIRS)
                m->n_timeouts = MAX_PAIRS;
        }
        memcpy(m->timeouts[k].command, name, sizeof(name));
    }
    m->timeouts[k].n++;
    pthread_mutex_unlock(&m->mu);
}

void rlai_metrics_count_plugin_call(rlai_metrics *m, const char *command, const char *transport)
{
    if (!m)
        return;
    rlai_metrics_count_request(m, "plugin_call", transport);
    char name[LABEL_MAX * 2], tr[LABEL_MAX];
    size_t i = 0;
    for (; command && command[i] && i < sizeof(name) - 1; i++) {
        char c = command[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '.';
        name[i] = ok ? c : '_';
    }
    name[i] = 0;
    copy_label(tr, transport);
    pthread_mutex_lock(&m->mu);
    int k = 0;
    while (k < m->n_calls && (strcmp(m->calls[k].command, name) || strcmp(m->calls[k].transport, tr)))
        k++;
    if (k == m->n_calls) {
        if (m->n_calls < MAX_PAIRS - 1) {
            m->n_calls++;
        } else {
            k = MAX_PAIRS - 1;     /* the last slot is for everything that did not fit */
            snprintf(name, sizeof(name), "other");
            snprintf(tr, sizeof(tr), "other");
            if (m->n_calls < MAX_PAIRS)
                m->n_calls = MAX_PAIRS;
        }
        memcpy(m->calls[k].command, name, sizeof(name));
        memcpy(m->calls[k].transport, tr, sizeof(tr));
    }
    m->calls[k].n++;
    pthread_mutex_unlock(&m->mu);
}

void rlai_metrics_set_plugin_workers_stuck(rlai_metrics *m, int n)
{
    if (!m)
        return;
    pthread_mutex_lock(&m->mu);
    m->workers_stuck = n;
    pthread_mutex_unlock(&m->mu);
}

void rlai_metrics_count_http_status(rlai_metrics *m, int status)
{
    if (!m)
        return;
    pthread_mutex_lock(&m->mu);
    int i = 0;
    while (i < m->n_codes && m->codes[i].code != status)
        i++;
    if (i == m->n_codes && m->n_codes < MAX_CODES) {
        m->codes[i].code = status;
        m->codes[i].n = 0;
        m->n_codes++;
    }
    if (i < m->n_codes)
        m->codes[i].n++;
    pthread_mutex_unlock(&m->mu);
}

static void hist_add(histogram *h, const double *bounds, size_t n, double v)
{
    size_t i = 0;
    while (i < n && v > bounds[i])
        i++;
    h->buckets[i]++;
    h->count++;
    h->sum += v;
}

/* Called with m->mu held. */
static transport_stats *transport_slot(rlai_metrics *m, const char *transport)
{
    char tr[LABEL_MAX];
    copy_label(tr, transport);
    for (int i = 0; i < m->n_tr; i++)
        if (!strcmp(m->tr[i].name, tr))
            return &m->tr[i];
    if (m->n_tr < MAX_TRANSPORTS - 1) {
        transport_stats *t = &m->tr[m->n_tr++];
        memcpy(t->name, tr, sizeof(tr));
        return t;
    }
    transport_stats *t = &m->tr[MAX_TRANSPORTS - 1];
    if (m->n_tr < MAX_TRANSPORTS) {
        m->n_tr = MAX_TRANSPORTS;
        strcpy(t->name, "other");
    }
    return t;
}

void rlai_metrics_observe_generation(rlai_metrics *m, const char *transport, int status,
                                     const rlai_gen_metrics *gm)
{
    if (!m)
        return;
    pthread_mutex_lock(&m->mu);
    transport_stats *t = transport_slot(m, transport);
    if (status < 0 || !gm) {
        t->errors++;
    } else {
        t->generations++;
        t->prompt_tokens += (uint64_t)(gm->prompt_tokens > 0 ? gm->prompt_tokens : 0);
        t->reused_tokens += (uint64_t)(gm->reused_tokens > 0 ? gm->reused_tokens : 0);
        t->gen_tokens += (uint64_t)(gm->gen_tokens > 0 ? gm->gen_tokens : 0);
        t->drafted_tokens += (uint64_t)(gm->drafted_tokens > 0 ? gm->drafted_tokens : 0);
        t->accepted_tokens += (uint64_t)(gm->accepted_tokens > 0 ? gm->accepted_tokens : 0);
        if (gm->gen_tokens >= 1)
            hist_add(&t->ttft, ttft_bounds, N_TTFT, gm->ttft_ms / 1000.0);
        if (gm->gen_tokens >= 2 && gm->decode_tps > 0)
            hist_add(&t->tps, tps_bounds, N_TPS, gm->decode_tps);
    }
    pthread_mutex_unlock(&m->mu);
}

/* ---------------------------------------------------------- rendering */



static void render_hist(rlai_strbuf *b, const char *name, const char *transport, const histogram *h,
                        const double *bounds, size_t n)
{
    uint64_t cum = 0;
    for (size_t i = 0; i < n; i++) {
        cum += h->buckets[i];
        rlai_strbuf_printf(b, "%s_bucket{transport=\"%s\",le=\"%g\"} %llu\n", name, transport, bounds[i],
                  (unsigned long long)cum);
    }
    cum += h->buckets[n];
    rlai_strbuf_printf(b, "%s_bucket{transport=\"%s\",le=\"+Inf\"} %llu\n", name, transport, (unsigned long long)cum);
    rlai_strbuf_printf(b, "%s_sum{transport=\"%s\"} %.6f\n", name, transport, h->sum);
    rlai_strbuf_printf(b, "%s_count{transport=\"%s\"} %llu\n", name, transport, (unsigned long long)h->count);
}

/* A counter family over transports: one line per transport. */
#define RENDER_PER_TRANSPORT(b, m, fam, help, type, field)                                    \
    do {                                                                                    \
        rlai_strbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", fam, help, fam, type);                  \
        for (int i_ = 0; i_ < (m)->n_tr; i_++)                                              \
            rlai_strbuf_printf(b, "%s{transport=\"%s\"} %llu\n", fam, (m)->tr[i_].name,              \
                      (unsigned long long)(m)->tr[i_].field);                               \
    } while (0)

char *rlai_metrics_render(rlai_metrics *m, const rlai_engine_stats *es, double uptime_s)
{
    rlai_strbuf b = { 0 };
    rlai_strbuf_printf(&b, "# HELP rlai_uptime_seconds Seconds since the daemon started.\n"
                  "# TYPE rlai_uptime_seconds gauge\nrlai_uptime_seconds %.3f\n", uptime_s);
    if (m) {
        pthread_mutex_lock(&m->mu);
        rlai_strbuf_printf(&b, "# HELP rlai_requests_total Requests received, by endpoint and transport.\n"
                      "# TYPE rlai_requests_total counter\n");
        for (int i = 0; i < m->n_pairs; i++)
            rlai_strbuf_printf(&b, "rlai_requests_total{endpoint=\"%s\",transport=\"%s\"} %llu\n", m->pairs[i].endpoint,
                      m->pairs[i].transport, (unsigned long long)m->pairs[i].n);
        rlai_strbuf_printf(&b, "# HELP rlai_http_responses_total HTTP responses, by status code.\n"
                      "# TYPE rlai_http_responses_total counter\n");
        for (int i = 0; i < m->n_codes; i++)
            rlai_strbuf_printf(&b, "rlai_http_responses_total{code=\"%d\"} %llu\n", m->codes[i].code,
                      (unsigned long long)m->codes[i].n);
        rlai_strbuf_printf(&b, "# HELP rlai_plugin_calls_total Plugin calls received, by command and transport.\n"
                      "# TYPE rlai_plugin_calls_total counter\n");
        for (int i = 0; i < m->n_calls; i++)
            rlai_strbuf_printf(&b, "rlai_plugin_calls_total{command=\"%s\",transport=\"%s\"} %llu\n", m->calls[i].command,
                      m->calls[i].transport, (unsigned long long)m->calls[i].n);
        rlai_strbuf_printf(&b, "# HELP rlai_plugin_calls_timed_out_total Plugin calls ended with TIMEOUT, by command.\n"
                      "# TYPE rlai_plugin_calls_timed_out_total counter\n");
        for (int i = 0; i < m->n_timeouts; i++)
            rlai_strbuf_printf(&b, "rlai_plugin_calls_timed_out_total{command=\"%s\"} %llu\n", m->timeouts[i].command,
                      (unsigned long long)m->timeouts[i].n);
        rlai_strbuf_printf(&b, "# HELP rlai_plugin_workers_stuck Plugin handlers still running past their deadline.\n"
                      "# TYPE rlai_plugin_workers_stuck gauge\nrlai_plugin_workers_stuck %d\n", m->workers_stuck);
        RENDER_PER_TRANSPORT(&b, m, "rlai_generations_total", "Generations that finished.", "counter",
                             generations);
        RENDER_PER_TRANSPORT(&b, m, "rlai_generation_errors_total", "Generations that ended with an error.",
                             "counter", errors);
        RENDER_PER_TRANSPORT(&b, m, "rlai_tokens_generated_total", "Tokens generated by finished generations.",
                             "counter", gen_tokens);
        RENDER_PER_TRANSPORT(&b, m, "rlai_prompt_tokens_total", "Prompt tokens of finished generations.",
                             "counter", prompt_tokens);
        RENDER_PER_TRANSPORT(&b, m, "rlai_prefix_tokens_reused_total",
                             "Prompt tokens taken from the prefix cache.", "counter", reused_tokens);
        RENDER_PER_TRANSPORT(&b, m, "rlai_spec_drafted_tokens_total",
                             "Speculative draft tokens verified (docs/SPECULATIVE.md).", "counter", drafted_tokens);
        RENDER_PER_TRANSPORT(&b, m, "rlai_spec_accepted_tokens_total",
                             "Speculative draft tokens accepted.", "counter", accepted_tokens);
        rlai_strbuf_printf(&b, "# HELP rlai_ttft_seconds Time to first token (submit to first sampled token).\n"
                      "# TYPE rlai_ttft_seconds histogram\n");
        for (int i = 0; i < m->n_tr; i++)
            render_hist(&b, "rlai_ttft_seconds", m->tr[i].name, &m->tr[i].ttft, ttft_bounds, N_TTFT);
        rlai_strbuf_printf(&b, "# HELP rlai_decode_tokens_per_second Decode rate of each generation.\n"
                      "# TYPE rlai_decode_tokens_per_second histogram\n");
        for (int i = 0; i < m->n_tr; i++)
            render_hist(&b, "rlai_decode_tokens_per_second", m->tr[i].name, &m->tr[i].tps, tps_bounds, N_TPS);
        pthread_mutex_unlock(&m->mu);
    }
    if (es) {
        rlai_strbuf_printf(&b, "# HELP rlai_kv_blocks KV cache blocks (16 tokens each), by state.\n"
                      "# TYPE rlai_kv_blocks gauge\n"
                      "rlai_kv_blocks{state=\"total\"} %d\nrlai_kv_blocks{state=\"used\"} %d\n"
                      "rlai_kv_blocks{state=\"cached\"} %d\nrlai_kv_blocks{state=\"pinned\"} %d\n"
                      "rlai_kv_blocks{state=\"free\"} %d\n",
                  es->kv_blocks_total, es->kv_blocks_used, es->kv_blocks_cached, es->kv_blocks_pinned,
                  es->kv_blocks_free);
        rlai_strbuf_printf(&b, "# HELP rlai_engine_running Sequences being decoded.\n# TYPE rlai_engine_running gauge\n"
                      "rlai_engine_running %d\n"
                      "# HELP rlai_engine_queued Requests waiting for admission.\n# TYPE rlai_engine_queued gauge\n"
                      "rlai_engine_queued %d\n", es->running, es->queued);
        rlai_strbuf_printf(&b, "# HELP rlai_engine_requests_total Requests the engine accepted.\n"
                      "# TYPE rlai_engine_requests_total counter\nrlai_engine_requests_total %llu\n"
                      "# HELP rlai_engine_tokens_generated_total Tokens the engine generated (all callers).\n"
                      "# TYPE rlai_engine_tokens_generated_total counter\nrlai_engine_tokens_generated_total %llu\n"
                      "# HELP rlai_engine_prompt_tokens_total Prompt tokens the engine admitted.\n"
                      "# TYPE rlai_engine_prompt_tokens_total counter\nrlai_engine_prompt_tokens_total %llu\n"
                      "# HELP rlai_engine_prefix_tokens_reused_total Prompt tokens served from the prefix cache.\n"
                      "# TYPE rlai_engine_prefix_tokens_reused_total counter\n"
                      "rlai_engine_prefix_tokens_reused_total %llu\n"
                      "# HELP rlai_engine_steps_total Scheduler steps (forward passes).\n"
                      "# TYPE rlai_engine_steps_total counter\nrlai_engine_steps_total %llu\n"
                      "# HELP rlai_engine_spec_drafted_tokens_total Speculative draft tokens verified (all callers).\n"
                      "# TYPE rlai_engine_spec_drafted_tokens_total counter\n"
                      "rlai_engine_spec_drafted_tokens_total %llu\n"
                      "# HELP rlai_engine_spec_accepted_tokens_total Speculative draft tokens accepted (all callers).\n"
                      "# TYPE rlai_engine_spec_accepted_tokens_total counter\n"
                      "rlai_engine_spec_accepted_tokens_total %llu\n",
                  (unsigned long long)es->requests_total, (unsigned long long)es->gen_tokens_total,
                  (unsigned long long)es->prompt_tokens_total, (unsigned long long)es->prompt_tokens_reused_total,
                  (unsigned long long)es->steps, (unsigned long long)es->spec_drafted_total,
                  (unsigned long long)es->spec_accepted_total);
    }
    rlai_strbuf_str(&b, "");                  /* an empty page is "" */
    return rlai_strbuf_take(&b);              /* NULL when out of memory */
}
