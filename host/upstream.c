/* upstream.c - one remote OpenAI-compatible engine (see upstream.h). */
#include "upstream.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "router.h"
#include "rlai/error.h"

void rlai_upstream_config_init(rlai_upstream_config *c)
{
    memset(c, 0, sizeof(*c));
    c->max_concurrency = 16;
    c->max_queue = 64;
    c->connect_timeout_ms = 5000;
    c->first_token_timeout_ms = 60000;
    c->stall_timeout_ms = 30000;
    c->max_retries = 2;
    c->retry_backoff_ms = 200;
    c->breaker_failures = 5;
    c->breaker_cooldown_ms = 10000;
    c->sampling_extras = true;
}

void rlai_upstream_config_clear(rlai_upstream_config *c)
{
    if (!c)
        return;
    free(c->name);
    free(c->base_url);
    free(c->api_key_env);
    free(c->api_key_file);
    free(c->spill_model);
    free(c->proxy);
    free(c->ca_file);
    for (int i = 0; i < c->n_models; i++) {
        free(c->models[i].name);
        free(c->models[i].remote);
    }
    free(c->models);
    memset(c, 0, sizeof(*c));
}

static int dup_opt(char **dst, const char *s)
{
    *dst = NULL;
    if (!s)
        return 0;
    return (*dst = strdup(s)) ? 0 : RLAI_ERR_NOMEM;
}

int rlai_upstream_config_copy(rlai_upstream_config *dst, const rlai_upstream_config *src)
{
    *dst = *src;
    dst->name = dst->base_url = dst->api_key_env = dst->api_key_file = dst->spill_model = dst->proxy = NULL;
    dst->ca_file = NULL;
    dst->models = NULL;
    dst->n_models = 0;
    int rc = dup_opt(&dst->name, src->name);
    if (!rc) rc = dup_opt(&dst->base_url, src->base_url);
    if (!rc) rc = dup_opt(&dst->api_key_env, src->api_key_env);
    if (!rc) rc = dup_opt(&dst->api_key_file, src->api_key_file);
    if (!rc) rc = dup_opt(&dst->spill_model, src->spill_model);
    if (!rc) rc = dup_opt(&dst->proxy, src->proxy);
    if (!rc) rc = dup_opt(&dst->ca_file, src->ca_file);
    if (!rc && src->n_models > 0) {
        dst->models = calloc((size_t)src->n_models, sizeof(*dst->models));
        if (!dst->models)
            rc = RLAI_ERR_NOMEM;
        for (int i = 0; !rc && i < src->n_models; i++) {
            dst->n_models = i + 1;
            rc = dup_opt(&dst->models[i].name, src->models[i].name);
            if (!rc)
                rc = dup_opt(&dst->models[i].remote, src->models[i].remote);
        }
    }
    if (rc)
        rlai_upstream_config_clear(dst);
    return rc;
}

int rlai_upstream_config_check(const rlai_upstream_config *c, char *err, size_t errlen)
{
    if (!c->name || !*c->name || strlen(c->name) > 64)
        return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG, "upstreams: every entry needs a \"name\" of 1..64 characters");
    for (const char *p = c->name; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '_' && *p != '-' && *p != '.')
            return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG,
                        "upstreams: name '%s' may hold only letters, digits, '_', '-' and '.'", c->name);
    if (!strcmp(c->name, "loremaster") || !strcmp(c->name, "default") || !strcmp(c->name, "local") ||
        !strcmp(c->name, "remote") || !strcmp(c->name, "auto"))
        return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG,
                    "upstreams: the name '%s' is reserved (loremaster/..., default, local, remote, auto)", c->name);
    if (!c->base_url || (strncmp(c->base_url, "http://", 7) && strncmp(c->base_url, "https://", 8)))
        return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG,
                    "upstreams.%s.base_url must be an http:// or https:// URL (e.g. http://host:8000/v1)", c->name);
    if (c->ca_file && strncmp(c->base_url, "https://", 8))
        return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG,
                    "upstreams.%s.ca_file is for an https:// base_url (this one is %s)", c->name, c->base_url);
    if (c->api_key_env && c->api_key_file)
        return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG,
                    "upstreams.%s: give api_key_env or api_key_file, not both", c->name);
    if (c->n_models == 0 && !c->spill_model)
        return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG,
                    "upstreams.%s: needs \"models\" or \"spill_model\" (nothing would be routed to it)", c->name);
    struct { const char *k; int v; int min; } lim[] = {
        { "max_concurrency", c->max_concurrency, 1 }, { "max_queue", c->max_queue, 0 },
        { "connect_timeout_ms", c->connect_timeout_ms, 1 }, { "first_token_timeout_ms", c->first_token_timeout_ms, 1 },
        { "stall_timeout_ms", c->stall_timeout_ms, 1 }, { "max_retries", c->max_retries, 0 },
        { "retry_backoff_ms", c->retry_backoff_ms, 0 }, { "breaker_failures", c->breaker_failures, 1 },
        { "breaker_cooldown_ms", c->breaker_cooldown_ms, 1 },
    };
    for (size_t i = 0; i < sizeof(lim) / sizeof(lim[0]); i++)
        if (lim[i].v < lim[i].min)
            return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG, "upstreams.%s.%s must be at least %d", c->name, lim[i].k,
                        lim[i].min);
    if (c->max_retries > 10)
        return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG, "upstreams.%s.max_retries must be at most 10", c->name);
    for (int i = 0; i < c->n_models; i++)
        if (!c->models[i].name || !*c->models[i].name || !c->models[i].remote || !*c->models[i].remote)
            return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG, "upstreams.%s.models: names must not be empty", c->name);
    return 0;
}

static char *trimmed(const char *s, size_t n)
{
    while (n && isspace((unsigned char)*s)) {
        s++;
        n--;
    }
    while (n && isspace((unsigned char)s[n - 1]))
        n--;
    char *o = malloc(n + 1);
    if (o) {
        memcpy(o, s, n);
        o[n] = 0;
    }
    return o;
}

int rlai_upstream_read_key(const rlai_upstream_config *c, char **key, char *err, size_t errlen)
{
    *key = NULL;
    if (c->api_key_env) {
        const char *v = getenv(c->api_key_env);
        if (!v || !*v)
            return rlai_errf(err, errlen, RLAI_ERR_NOT_FOUND, "upstreams.%s: environment variable %s is not set",
                        c->name, c->api_key_env);
        *key = trimmed(v, strlen(v));
        return *key ? 0 : RLAI_ERR_NOMEM;
    }
    if (!c->api_key_file)
        return 0;
    int fd = open(c->api_key_file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return rlai_errf(err, errlen, RLAI_ERR_IO, "upstreams.%s: cannot open api_key_file %s: %s", c->name,
                    c->api_key_file, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG, "upstreams.%s: api_key_file %s is not a regular file",
                    c->name, c->api_key_file);
    }
    if (st.st_mode & 077) {
        close(fd);
        return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG,
                    "upstreams.%s: api_key_file %s has mode %04o: group and others must have no access "
                    "(chmod 600 it)", c->name, c->api_key_file, (unsigned)(st.st_mode & 07777));
    }
    char buf[4097];
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n < 0)
        return rlai_errf(err, errlen, RLAI_ERR_IO, "upstreams.%s: cannot read %s: %s", c->name, c->api_key_file,
                    strerror(errno));
    if (n == (ssize_t)sizeof(buf) - 1)
        return rlai_errf(err, errlen, RLAI_ERR_TOO_LARGE, "upstreams.%s: %s is longer than 4 KiB", c->name,
                    c->api_key_file);
    *key = trimmed(buf, (size_t)n);
    if (!*key)
        return RLAI_ERR_NOMEM;
    if (!**key) {
        free(*key);
        *key = NULL;
        return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG, "upstreams.%s: %s is empty", c->name, c->api_key_file);
    }
    return 0;
}

/* ---------------------------------------------------------- breaker */

void rlai_breaker_init(rlai_breaker *b, int threshold, int cooldown_ms)
{
    memset(b, 0, sizeof(*b));
    b->threshold = threshold > 0 ? threshold : 1;
    b->cooldown_ms = cooldown_ms > 0 ? cooldown_ms : 1;
}

bool rlai_breaker_would_allow(const rlai_breaker *b, uint64_t now_ms)
{
    switch (b->state) {
    case RLAI_BREAKER_CLOSED: return true;
    case RLAI_BREAKER_OPEN: return now_ms >= b->opened_at + (uint64_t)b->cooldown_ms;
    default: return !b->trial_out;
    }
}

bool rlai_breaker_allow(rlai_breaker *b, uint64_t now_ms)
{
    if (b->state == RLAI_BREAKER_CLOSED)
        return true;
    if (b->state == RLAI_BREAKER_OPEN) {
        if (now_ms < b->opened_at + (uint64_t)b->cooldown_ms)
            return false;
        b->state = RLAI_BREAKER_HALF_OPEN;
        b->trial_out = false;
    }
    if (b->trial_out)
        return false;
    b->trial_out = true;
    return true;
}

void rlai_breaker_success(rlai_breaker *b)
{
    b->state = RLAI_BREAKER_CLOSED;
    b->fails = 0;
    b->trial_out = false;
}

void rlai_breaker_failure(rlai_breaker *b, uint64_t now_ms)
{
    b->fails++;
    if (b->state == RLAI_BREAKER_HALF_OPEN || (b->state == RLAI_BREAKER_CLOSED && b->fails >= b->threshold)) {
        b->state = RLAI_BREAKER_OPEN;
        b->opened_at = now_ms;
        b->opens_total++;
    }
    b->trial_out = false;
}

const char *rlai_breaker_state_name(rlai_breaker_state s)
{
    switch (s) {
    case RLAI_BREAKER_CLOSED: return "closed";
    case RLAI_BREAKER_OPEN: return "open";
    default: return "half_open";
    }
}

/* ---------------------------------------------------------- request body */

int rlai_upstream_build_body(const rlai_route_request *rq, const char *remote_model, bool extras, char **body,
                             bool *chat, char *err, size_t errlen)
{
    *body = NULL;
    const rlai_text_request *t = &rq->text;
    const rlai_gen_params *g = &t->rp.gen;
    bool want_lp = g->top_logprobs >= 0 && g->on_logprobs;
    if (want_lp && !rq->on_remote_logprobs)
        return rlai_errf(err, errlen, RLAI_ERR_UNSUPPORTED,
                    "logprobs of remote models are not implemented for this caller (it takes the local "
                    "model's token ids; the wire protocol, the pipe and HTTP give a remote model's as text)");
    if (want_lp && g->prompt_logprobs)
        return rlai_errf(err, errlen, RLAI_ERR_NOT_IMPLEMENTED,
                    "'echo' with 'logprobs' (the prompt tokens' log-probabilities) is not implemented for "
                    "remote models");
    if (g->grammar && !(rq->response_format && *rq->response_format))
        return rlai_errf(err, errlen, RLAI_ERR_UNSUPPORTED,
                    "a grammar is not implemented for remote models (only a response_format is forwarded)");
    if (g->ignore_eos && !extras)
        return rlai_errf(err, errlen, RLAI_ERR_UNSUPPORTED,
                    "ignore_eos is not an OpenAI field: this upstream has \"sampling_extras\": false");
    bool has_msgs = t->messages && t->n_messages > 0;
    bool has_prompt = t->prompt != NULL;
    if (!has_msgs && !has_prompt && t->rp.prompt && t->rp.n_prompt > 0)
        return rlai_errf(err, errlen, RLAI_ERR_UNSUPPORTED,
                    "token-id prompts are not implemented for remote models (the ids are the local model's)");
    if (has_msgs == has_prompt)
        return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG, "exactly one of messages or prompt must be given");
    if (has_prompt && !*t->prompt)
        return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG, "the prompt is empty");
    if (rq->image_url && (!has_msgs || rq->messages_json))
        return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG, "an image URL needs messages (it joins the last user turn)");
    cJSON *j = cJSON_CreateObject();
    cJSON *rf = NULL;
    if (rq->response_format && *rq->response_format) {
        rf = cJSON_Parse(rq->response_format);
        if (!rf || !cJSON_IsObject(rf)) {
            cJSON_Delete(rf);
            cJSON_Delete(j);
            return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG, "response_format is not a JSON object");
        }
    }
    if (!j) {
        cJSON_Delete(rf);
        return RLAI_ERR_NOMEM;
    }
    cJSON_AddStringToObject(j, "model", remote_model);
    cJSON *fwd = rq->forward_json ? cJSON_Parse(rq->forward_json) : NULL;
    cJSON *raw = rq->messages_json && has_msgs ? cJSON_Parse(rq->messages_json) : NULL;
    if ((rq->forward_json && (!cJSON_IsObject(fwd) || !has_msgs)) || (rq->messages_json && !cJSON_IsArray(raw))) {
        cJSON_Delete(fwd);
        cJSON_Delete(raw);
        cJSON_Delete(rf);
        cJSON_Delete(j);
        return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG, "forwarded fields or messages are not valid JSON");
    }
    if (raw) {
        cJSON_AddItemToObject(j, "messages", raw);
    } else if (has_msgs) {
        int last_user = -1;
        for (int i = 0; i < t->n_messages; i++)
            if (t->messages[i].role && !strcmp(t->messages[i].role, "user"))
                last_user = i;
        cJSON *ms = cJSON_AddArrayToObject(j, "messages");
        for (int i = 0; i < t->n_messages; i++) {
            cJSON *m = cJSON_CreateObject();
            const char *content = t->messages[i].content ? t->messages[i].content : "";
            cJSON_AddStringToObject(m, "role", t->messages[i].role ? t->messages[i].role : "user");
            if (rq->image_url && i == last_user) {     /* [text, image_url] parts */
                cJSON *parts = cJSON_AddArrayToObject(m, "content");
                cJSON *tp = cJSON_CreateObject(), *ip = cJSON_CreateObject();
                cJSON_AddStringToObject(tp, "type", "text");
                cJSON_AddStringToObject(tp, "text", content);
                cJSON_AddStringToObject(ip, "type", "image_url");
                cJSON_AddStringToObject(cJSON_AddObjectToObject(ip, "image_url"), "url", rq->image_url);
                cJSON_AddItemToArray(parts, tp);
                cJSON_AddItemToArray(parts, ip);
            } else {
                cJSON_AddStringToObject(m, "content", content);
            }
            cJSON_AddItemToArray(ms, m);
        }
    } else {
        cJSON_AddStringToObject(j, "prompt", t->prompt);
    }
    cJSON_AddTrueToObject(j, "stream");
    cJSON *so = cJSON_AddObjectToObject(j, "stream_options");
    cJSON_AddTrueToObject(so, "include_usage");
    const rlai_sampler_params *s = &g->sampling;
    cJSON_AddNumberToObject(j, "temperature", s->temperature);
    /* sampling knobs are sent even when neutral: an upstream's own defaults
     * (rlai's product defaults, say) must not replace the request's */
    cJSON_AddNumberToObject(j, "top_p", s->top_p > 0.0f && s->top_p <= 1.0f ? s->top_p : 1.0f);
    if (g->max_tokens > 0)
        cJSON_AddNumberToObject(j, "max_tokens", g->max_tokens);
    /* an exact integer literal (a double would print 2^53+ with an exponent);
     * 63 bits: upstreams take a signed 64-bit seed */
    char seed[24];
    snprintf(seed, sizeof(seed), "%llu", (unsigned long long)(s->seed & INT64_MAX));
    cJSON_AddRawToObject(j, "seed", seed);
    if (s->presence_penalty != 0.0f)
        cJSON_AddNumberToObject(j, "presence_penalty", s->presence_penalty);
    if (s->frequency_penalty != 0.0f)
        cJSON_AddNumberToObject(j, "frequency_penalty", s->frequency_penalty);
    if (g->logit_bias && g->n_logit_bias > 0) {   /* the upstream's token ids (OpenAI's field) */
        cJSON *lb = cJSON_AddObjectToObject(j, "logit_bias");
        for (int i = 0; i < g->n_logit_bias; i++) {
            char key[16];
            snprintf(key, sizeof(key), "%d", (int)g->logit_bias[i].token);
            cJSON_DeleteItemFromObjectCaseSensitive(lb, key);   /* the last entry counts */
            cJSON_AddNumberToObject(lb, key, g->logit_bias[i].bias);
        }
    }
    if (g->prediction && g->prediction[0] && has_msgs) {   /* OpenAI's predicted outputs (chat only) */
        cJSON *pr = cJSON_AddObjectToObject(j, "prediction");
        cJSON_AddStringToObject(pr, "type", "content");
        cJSON_AddStringToObject(pr, "content", g->prediction);
    }
    if (extras) {
        cJSON_AddNumberToObject(j, "top_k", s->top_k > 0 ? s->top_k : 0);   /* 0 = off (vLLM: 0 or -1) */
        cJSON_AddNumberToObject(j, "min_p", s->min_p > 0.0f ? s->min_p : 0.0f);
        if (s->repeat_penalty != 1.0f && s->repeat_penalty > 0.0f) {
            cJSON_AddNumberToObject(j, "repetition_penalty", s->repeat_penalty);   /* vLLM, SGLang */
            cJSON_AddNumberToObject(j, "repeat_penalty", s->repeat_penalty);       /* llama.cpp, rlai */
        }
    }
    if (g->ignore_eos)
        cJSON_AddTrueToObject(j, "ignore_eos");   /* vLLM, SGLang, llama.cpp, rlai; only with extras */
    if (g->stop && g->stop[0]) {
        cJSON *st = cJSON_AddArrayToObject(j, "stop");
        for (int i = 0; g->stop[i]; i++)
            cJSON_AddItemToArray(st, cJSON_CreateString(g->stop[i]));
    }
    if (want_lp && has_msgs) {
        cJSON_AddTrueToObject(j, "logprobs");
        cJSON_AddNumberToObject(j, "top_logprobs", g->top_logprobs);
    } else if (want_lp) {
        cJSON_AddNumberToObject(j, "logprobs", g->top_logprobs);   /* legacy completions: alternatives */
    }
    if (rf)
        cJSON_AddItemToObject(j, "response_format", rf);
    for (cJSON *f = fwd ? fwd->child : NULL, *nx; f; f = nx) {
        nx = f->next;
        cJSON_DeleteItemFromObjectCaseSensitive(j, f->string);
        cJSON_AddItemToObject(j, f->string, cJSON_DetachItemViaPointer(fwd, f));
    }
    cJSON_Delete(fwd);
    *body = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    *chat = has_msgs;
    return *body ? 0 : RLAI_ERR_NOMEM;
}

/* ---------------------------------------------------------- stream chunks */

/* A log-probability as sent: a number, or null for "none" (-9999, as the
 * HTTP front writes -inf). False for anything else. */
static bool lp_number(const cJSON *v, double *out)
{
    if (cJSON_IsNull(v)) {
        *out = -9999.0;
        return true;
    }
    if (!cJSON_IsNumber(v))
        return false;
    *out = v->valuedouble;
    return true;
}

/* {token, logprob, bytes}: bytes copied when the upstream sent a valid
 * array, else the token's own UTF-8. NULL when malformed or out of memory. */
static cJSON *lp_entry(const cJSON *tok, const cJSON *lp, const cJSON *bytes)
{
    double v;
    if (!cJSON_IsString(tok) || !lp_number(lp, &v))
        return NULL;
    cJSON *o = cJSON_CreateObject();
    cJSON *b = cJSON_CreateArray();
    bool ok = o && b && cJSON_AddStringToObject(o, "token", tok->valuestring) && cJSON_AddNumberToObject(o, "logprob", v);
    bool given = cJSON_IsArray(bytes);
    for (const cJSON *x = given ? bytes->child : NULL; ok && x; x = x->next)
        given = cJSON_IsNumber(x) && x->valuedouble >= 0 && x->valuedouble <= 255 && x->valuedouble == (int)x->valuedouble;
    if (given)
        for (const cJSON *x = bytes->child; ok && x; x = x->next)
            ok = cJSON_AddItemToArray(b, cJSON_CreateNumber(x->valuedouble));
    else
        for (const unsigned char *s = (const unsigned char *)tok->valuestring; ok && *s; s++)
            ok = cJSON_AddItemToArray(b, cJSON_CreateNumber(*s));
    if (ok && cJSON_AddItemToObject(o, "bytes", b))
        return o;
    cJSON_Delete(b);
    cJSON_Delete(o);
    return NULL;
}

/* Members a and b of o are absent, null or strings. */
static bool strings_or_null(const cJSON *o, const char *a, const char *b)
{
    const cJSON *v[2] = { cJSON_GetObjectItemCaseSensitive(o, a), cJSON_GetObjectItemCaseSensitive(o, b) };
    for (int k = 0; k < 2; k++)
        if (v[k] && !cJSON_IsNull(v[k]) && !cJSON_IsString(v[k]))
            return false;
    return true;
}

/* delta.tool_calls: an array of objects with an integer "index" and, when
 * present, string "id" / "type" and a "function" object of strings. */
static bool tool_calls_ok(const cJSON *tc)
{
    if (!cJSON_IsArray(tc))
        return false;
    for (const cJSON *c = tc->child; c; c = c->next) {
        const cJSON *ix = cJSON_GetObjectItemCaseSensitive(c, "index");
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
        if (!cJSON_IsObject(c) || !cJSON_IsNumber(ix) || ix->valuedouble < 0 || ix->valuedouble > 1024 ||
            ix->valuedouble != (int)ix->valuedouble)
            return false;
        if (!strings_or_null(c, "id", "type") ||
            (fn && !cJSON_IsNull(fn) && (!cJSON_IsObject(fn) || !strings_or_null(fn, "name", "arguments"))))
            return false;
    }
    return true;
}

/* *out = o's count `key` when it is a number in [0, 1e9); else unchanged
 * (o may be NULL). */
static void usage_count(const cJSON *o, const char *key, int *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble < 1e9)
        *out = (int)v->valuedouble;
}

/* choices[0].logprobs of a chunk as chat entries (upstream.h), in *out
 * (NULL when it has none). Chat: {"content": [{token, logprob, bytes,
 * top_logprobs}]}; completions: {"tokens", "token_logprobs",
 * "top_logprobs": [{text: logprob}]}. */
static int chunk_logprobs(const cJSON *lp, cJSON **out, char *msg, size_t msglen)
{
    *out = NULL;
    if (!lp || cJSON_IsNull(lp))
        return 0;
    const cJSON *content = cJSON_IsObject(lp) ? cJSON_GetObjectItemCaseSensitive(lp, "content") : NULL;
    const cJSON *toks = cJSON_IsObject(lp) ? cJSON_GetObjectItemCaseSensitive(lp, "tokens") : NULL;
    if (cJSON_IsNull(content) || (!content && cJSON_IsNull(toks)))
        return 0;
    if (!cJSON_IsArray(content) && !cJSON_IsArray(toks))
        return rlai_errf(msg, msglen, RLAI_ERR_FORMAT, "upstream chunk: logprobs has neither content nor tokens");
    cJSON *arr = cJSON_CreateArray();
    if (!arr)
        return RLAI_ERR_NOMEM;
    bool ok = true;
    const cJSON *lps = NULL, *tops = NULL, *lv = NULL, *tp = NULL;
    bool chat = cJSON_IsArray(content);
    if (!chat) {             /* legacy completions: parallel arrays */
        lps = cJSON_GetObjectItemCaseSensitive(lp, "token_logprobs");
        tops = cJSON_GetObjectItemCaseSensitive(lp, "top_logprobs");
        int n = cJSON_GetArraySize(toks);
        ok = cJSON_IsArray(lps) && cJSON_GetArraySize(lps) == n &&
             (!tops || cJSON_IsNull(tops) || (cJSON_IsArray(tops) && cJSON_GetArraySize(tops) == n));
        lv = ok ? lps->child : NULL;
        tp = ok && cJSON_IsArray(tops) ? tops->child : NULL;
    }
    const cJSON *it = chat ? content->child : toks->child;
    for (; ok && it; it = it->next) {
        cJSON *e, *top;
        const cJSON *alt;
        if (chat) {
            e = lp_entry(cJSON_GetObjectItemCaseSensitive(it, "token"), cJSON_GetObjectItemCaseSensitive(it, "logprob"),
                         cJSON_GetObjectItemCaseSensitive(it, "bytes"));
            alt = cJSON_GetObjectItemCaseSensitive(it, "top_logprobs");
            alt = cJSON_IsArray(alt) ? alt->child : NULL;
        } else {
            e = lp_entry(it, lv, NULL);
            alt = cJSON_IsObject(tp) ? tp->child : NULL;   /* {text: logprob} */
            lv = lv->next;
            tp = tp ? tp->next : NULL;
        }
        top = e ? cJSON_AddArrayToObject(e, "top_logprobs") : NULL;
        for (; top && alt; alt = alt->next) {
            cJSON name = { 0 };                /* a legacy entry's key as a token string */
            name.type = cJSON_String;
            name.valuestring = alt->string;
            cJSON *te = chat ? lp_entry(cJSON_GetObjectItemCaseSensitive(alt, "token"),
                                        cJSON_GetObjectItemCaseSensitive(alt, "logprob"),
                                        cJSON_GetObjectItemCaseSensitive(alt, "bytes"))
                             : lp_entry(&name, alt, NULL);
            if (!te || !cJSON_AddItemToArray(top, te)) {
                cJSON_Delete(te);
                top = NULL;
            }
        }
        ok = top && cJSON_AddItemToArray(arr, e);
        if (!ok)
            cJSON_Delete(e);
    }
    if (!ok) {
        cJSON_Delete(arr);
        return rlai_errf(msg, msglen, RLAI_ERR_FORMAT, "upstream chunk: logprobs is not in the OpenAI shape");
    }
    *out = arr;
    return 0;
}

int rlai_upstream_parse_chunk(const char *data, size_t len, rlai_upstream_delta *out, char *msg, size_t msglen)
{
    memset(out, 0, sizeof(*out));
    out->prompt_tokens = out->completion_tokens = -1;
    out->accepted_prediction = out->rejected_prediction = -1;
    while (len && isspace((unsigned char)*data)) {
        data++;
        len--;
    }
    if (len == 6 && !memcmp(data, "[DONE]", 6))
        return 1;
    cJSON *j = cJSON_ParseWithLength(data, len);
    if (!j || !cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return rlai_errf(msg, msglen, RLAI_ERR_FORMAT, "upstream sent an event that is not a JSON object");
    }
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    if (e && !cJSON_IsNull(e)) {
        const cJSON *m = cJSON_IsObject(e) ? cJSON_GetObjectItemCaseSensitive(e, "message") : e;
        int rc = rlai_errf(msg, msglen, RLAI_ERR_DISCONNECTED, "upstream error: %.200s",
                      cJSON_IsString(m) ? m->valuestring : "(no message)");
        cJSON_Delete(j);
        return rc;
    }
    const cJSON *ch = cJSON_GetObjectItemCaseSensitive(j, "choices");
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(j, "usage");
    if (!cJSON_IsArray(ch) && !cJSON_IsObject(u)) {
        cJSON_Delete(j);
        return rlai_errf(msg, msglen, RLAI_ERR_FORMAT, "upstream chunk has neither choices nor usage");
    }
    const cJSON *c0 = cJSON_IsArray(ch) ? cJSON_GetArrayItem(ch, 0) : NULL;
    if (c0) {
        if (!cJSON_IsObject(c0)) {
            cJSON_Delete(j);
            return rlai_errf(msg, msglen, RLAI_ERR_FORMAT, "upstream chunk: choices[0] is not an object");
        }
        const cJSON *txt = cJSON_GetObjectItemCaseSensitive(c0, "text");
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(c0, "delta");
        const cJSON *tc = NULL;
        if (cJSON_IsObject(d)) {
            txt = cJSON_GetObjectItemCaseSensitive(d, "content");
            tc = cJSON_GetObjectItemCaseSensitive(d, "tool_calls");
        }
        if (tc && !cJSON_IsNull(tc) && !tool_calls_ok(tc)) {
            cJSON_Delete(j);
            return rlai_errf(msg, msglen, RLAI_ERR_FORMAT, "upstream chunk: delta.tool_calls is not in the OpenAI shape");
        }
        if (txt && !cJSON_IsNull(txt) && !cJSON_IsString(txt)) {
            cJSON_Delete(j);
            return rlai_errf(msg, msglen, RLAI_ERR_FORMAT, "upstream chunk: text is not a string");
        }
        if (cJSON_IsString(txt) && txt->valuestring[0]) {
            out->len = strlen(txt->valuestring);
            out->text = strdup(txt->valuestring);
            if (!out->text) {
                cJSON_Delete(j);
                return RLAI_ERR_NOMEM;
            }
        }
        int rc = chunk_logprobs(cJSON_GetObjectItemCaseSensitive(c0, "logprobs"), &out->logprobs, msg, msglen);
        if (rc == 0 && cJSON_IsArray(tc) && cJSON_GetArraySize(tc) > 0 && !(out->tool_calls = cJSON_Duplicate(tc, 1)))
            rc = RLAI_ERR_NOMEM;
        if (rc < 0) {
            free(out->text);
            out->text = NULL;
            cJSON_Delete(out->logprobs);
            out->logprobs = NULL;
            cJSON_Delete(j);
            return rc;
        }
        const cJSON *fr = cJSON_GetObjectItemCaseSensitive(c0, "finish_reason");
        if (cJSON_IsString(fr)) {
            const cJSON *sr = cJSON_GetObjectItemCaseSensitive(c0, "stop_reason");   /* vLLM: the stop string */
            if (!strcmp(fr->valuestring, "length"))
                out->finish = RLAI_STOP_MAX_TOKENS;
            else if (!strcmp(fr->valuestring, "timeout"))
                out->finish = RLAI_STOP_TIMEOUT;
            else if (cJSON_IsString(sr))
                out->finish = RLAI_STOP_STRING;
            else
                out->finish = RLAI_STOP_EOG;
        }
    }
    if (cJSON_IsObject(u)) {
        const cJSON *cd = cJSON_GetObjectItemCaseSensitive(u, "completion_tokens_details");
        usage_count(u, "prompt_tokens", &out->prompt_tokens);
        usage_count(u, "completion_tokens", &out->completion_tokens);
        usage_count(cd, "accepted_prediction_tokens", &out->accepted_prediction);
        usage_count(cd, "rejected_prediction_tokens", &out->rejected_prediction);
    }
    cJSON_Delete(j);
    return 0;
}
