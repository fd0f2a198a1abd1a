/* loremaster.c - the LoreMaster plugin: in-character dialogue with the
 * characters of JSON lore packs (plugins/loremaster/README.md).
 *
 * At load every character's system prompt (world lore + persona + rules)
 * is built and its KV pinned in the engine's prefix cache, so a first line
 * prefills only the player's words. Conversations are kept per (session,
 * character); a follow-up prompt starts with the previous prompt and
 * reply, so the prefix cache serves the earlier turns too.
 *
 * Commands: loremaster.talk, loremaster.characters, loremaster.reset.
 * Handlers run on several worker threads at once: the only mutable state
 * is the session store, which locks itself for short copies only.
 */
#include <rlai/plugin.h>
#include <rlai/plugin_json.h>

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lorepack.h"
#include "session.h"

RLAI_PLUGIN_DECLARE();

#define DEFAULT_TEMPERATURE 0.8f   /* the product default (docs/DEFAULTS.md) when the pack sets none */
#define DEFAULT_MAX_TOKENS 160
#define DEFAULT_MAX_MESSAGE 2000
#define DEFAULT_MAX_SESSIONS 256
#define DEFAULT_MAX_TURNS 32

typedef struct lm_char_state {
    int pinned_tokens;          /* tokens of the lore held in the prefix cache */
    int lore_tokens;            /* tokens every prompt of the character shares */
} lm_char_state;

typedef struct loremaster {
    const rlai_host_api *host;
    rlai_plugin *self;
    lorepack_set lore;
    lm_char_state *cs;          /* one per lore.chars */
    session_store *store;
    int max_message_bytes, max_sessions, max_turns;
    float temperature;          /* < 0: the pack's, else DEFAULT_TEMPERATURE */
    int max_tokens;             /* 0: the pack's, else DEFAULT_MAX_TOKENS */
    int context_tokens;         /* prompt + reply budget; 0 = unknown */
    int max_prompt_tokens;      /* the host's prompt limit; 0 = unknown */
    char *model;                /* config "model": where talk runs (NULL = the local model;
                                   a remote model of the host's upstreams, docs/REMOTE.md) */
} loremaster;

/* ---- helpers ------------------------------------------------------------- */

/* A fresh seed per call (time and a counter through splitmix64), so replies
 * at temperature > 0 vary unless the caller fixes "seed". */
static uint64_t fresh_seed(void)
{
    static atomic_uint_fast64_t counter;
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    uint64_t x = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec +
                 0x9E3779B97F4A7C15u * (uint64_t)(atomic_fetch_add(&counter, 1) + 1);
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9u;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBu;
    return (x ^ (x >> 31)) & ((1ull << 53) - 1);   /* exact in a JSON number */
}

static void lm_free(loremaster *lm)
{
    if (!lm)
        return;
    session_store_free(lm->store);
    lorepack_set_free(&lm->lore);
    free(lm->cs);
    free(lm->model);
    free(lm);
}

static char *host_strdup(const rlai_host_api *h, const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = h->alloc(n);
    if (p)
        memcpy(p, s, n);
    return p;
}

/* ---- configuration and loading ------------------------------------------- */

static int load_packs(loremaster *lm, const cJSON *cfg, char *err, size_t errlen)
{
    const rlai_host_api *h = lm->host;
    const cJSON *packs = cJSON_GetObjectItemCaseSensitive(cfg, "packs");
    cJSON *deflt = NULL;
    if (!packs) {
        deflt = cJSON_CreateStringArray((const char *[]){ "lore" }, 1);
        if (!deflt) {
            snprintf(err, errlen, "out of memory");
            return RLAI_ERR_NOMEM;
        }
        packs = deflt;
    }
    int rc = 0;
    if (!cJSON_IsArray(packs) || cJSON_GetArraySize(packs) == 0) {
        snprintf(err, errlen, "config \"packs\" must be a non-empty array of paths");
        rc = RLAI_ERR_INVALID_ARG;
    }
    const char *dir = h->plugin_dir(lm->self);
    for (const cJSON *it = packs->child; rc == 0 && it; it = it->next) {
        if (!cJSON_IsString(it) || !it->valuestring[0]) {
            snprintf(err, errlen, "config \"packs\": every item must be a non-empty path");
            rc = RLAI_ERR_INVALID_ARG;
            break;
        }
        const char *p = it->valuestring;
        size_t len = strlen(dir) + strlen(p) + 2;
        char *full = malloc(len);
        if (!full) {
            rc = RLAI_ERR_NOMEM;
            snprintf(err, errlen, "out of memory");
            break;
        }
        if (p[0] == '/')
            snprintf(full, len, "%s", p);
        else
            snprintf(full, len, "%s/%s", dir, p);
        int n = lorepack_add_path(&lm->lore, full, err, errlen);
        free(full);
        if (n < 0)
            rc = n;
    }
    cJSON_Delete(deflt);
    if (rc == 0 && lm->lore.n == 0) {
        snprintf(err, errlen, "no characters in the configured lore packs");
        rc = RLAI_ERR_NOT_FOUND;
    }
    return rc;
}

static int read_config(loremaster *lm, const cJSON *cfg, char *err, size_t errlen)
{
    static const char *const keys[] = { "packs", "max_message_bytes", "max_sessions", "max_turns",
                                        "temperature", "max_tokens", "context_tokens", "model", NULL };
    for (const cJSON *it = cfg->child; it; it = it->next) {
        bool known = false;
        for (int i = 0; keys[i] && !known; i++)
            known = it->string && strcmp(it->string, keys[i]) == 0;
        if (!known)
            lm->host->log(lm->self, RLAI_LOG_WARN, "config: unknown key \"%s\" ignored",
                          it->string ? it->string : "");
    }
    lm->max_message_bytes = DEFAULT_MAX_MESSAGE;
    lm->max_sessions = DEFAULT_MAX_SESSIONS;
    lm->max_turns = DEFAULT_MAX_TURNS;
    lm->temperature = -1;
    lm->max_tokens = 0;
    lm->context_tokens = 0;
    int rc;
    char why[256];
    if ((rc = rlai_json_opt_int(cfg, "max_message_bytes", 1, 1 << 20, &lm->max_message_bytes, why, sizeof why)) ||
        (rc = rlai_json_opt_int(cfg, "max_sessions", 1, 1 << 20, &lm->max_sessions, why, sizeof why)) ||
        (rc = rlai_json_opt_int(cfg, "max_turns", 1, 4096, &lm->max_turns, why, sizeof why)) ||
        (rc = rlai_json_opt_float(cfg, "temperature", 0, 2, &lm->temperature, why, sizeof why)) ||
        (rc = rlai_json_opt_int(cfg, "max_tokens", 1, 4096, &lm->max_tokens, why, sizeof why)) ||
        (rc = rlai_json_opt_int(cfg, "context_tokens", 64, 1 << 24, &lm->context_tokens, why, sizeof why))) {
        snprintf(err, errlen, "config: %s", why);
        return rc;
    }
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(cfg, "model");
    if (m && !cJSON_IsNull(m)) {
        if (!cJSON_IsString(m) || strlen(m->valuestring) > 256) {
            snprintf(err, errlen, "config: \"model\" must be a model name (at most 256 bytes)");
            return RLAI_ERR_INVALID_ARG;
        }
        if (m->valuestring[0] && !(lm->model = strdup(m->valuestring)))
            return RLAI_ERR_NOMEM;
    }
    return 0;
}

/* The text every prompt of a character starts with: the longest common
 * prefix of two conversations that differ only in the user's words (so it
 * does not depend on the chat template), cut to a whole UTF-8 character.
 * *out allocated with malloc. */
static int shared_prefix(loremaster *lm, const lore_character *c, char **out)
{
    const rlai_host_api *h = lm->host;
    rlai_plugin_message a[2] = { { "system", c->system_prompt }, { "user", "a" } };
    rlai_plugin_message b[2] = { { "system", c->system_prompt }, { "user", "b" } };
    char *ta = NULL, *tb = NULL;
    int rc = h->apply_chat(lm->self, a, 2, true, &ta);
    if (rc >= 0)
        rc = h->apply_chat(lm->self, b, 2, true, &tb);
    if (rc >= 0) {
        size_t n = 0;
        while (ta[n] && ta[n] == tb[n])
            n++;
        while (n > 0 && ((unsigned char)ta[n] & 0xC0) == 0x80)
            n--;
        *out = malloc(n + 1);
        if (!*out)
            rc = RLAI_ERR_NOMEM;
        else {
            memcpy(*out, ta, n);
            (*out)[n] = '\0';
            rc = 0;
        }
    }
    h->free(ta);
    h->free(tb);
    return rc;
}

/* Pins every character's lore. Without an engine nothing is pinned (talk
 * then fails with the engine's error); a pool too small for a character's
 * lore only costs speed. */
static void pin_lore(loremaster *lm)
{
    const rlai_host_api *h = lm->host;
    cJSON *info = NULL;
    int rc = h->model_info(lm->self, &info);
    if (rc == RLAI_ERR_NOT_IMPLEMENTED) {
        h->log(lm->self, RLAI_LOG_INFO, "no model loaded: lore not pinned");
        return;
    }
    if (rc == 0 && info) {
        const cJSON *n_ctx = cJSON_GetObjectItemCaseSensitive(info, "n_ctx");
        const cJSON *max_prompt = cJSON_GetObjectItemCaseSensitive(info, "max_prompt_tokens");
        if (lm->context_tokens == 0 && cJSON_IsNumber(n_ctx) && n_ctx->valuedouble > 0)
            lm->context_tokens = (int)n_ctx->valuedouble;
        if (cJSON_IsNumber(max_prompt) && max_prompt->valuedouble > 0)
            lm->max_prompt_tokens = (int)max_prompt->valuedouble;
    }
    cJSON_Delete(info);
    int total = 0;
    for (int i = 0; i < lm->lore.n; i++) {
        const lore_character *c = &lm->lore.chars[i];
        char *prefix = NULL;
        rc = shared_prefix(lm, c, &prefix);
        if (rc == 0) {
            int nt = h->tokenize(lm->self, prefix, true, true, NULL, 0);
            lm->cs[i].lore_tokens = nt > 0 ? nt : 0;
            rc = h->pin_prefix(lm->self, prefix);
        }
        free(prefix);
        if (rc < 0) {
            h->log(lm->self, RLAI_LOG_WARN, "%s: lore not pinned: %s", c->id, h->strerror(rc));
            continue;
        }
        lm->cs[i].pinned_tokens = rc;
        total += rc;
    }
    h->log(lm->self, RLAI_LOG_INFO, "%d characters, %d lore tokens pinned", lm->lore.n, total);
}

/* ---- loremaster.talk ------------------------------------------------------ */

/* Messages: system, the history turns from `first` on, the new line.
 * Returns the count; msgs has room for 2 + 2 * h->n. */
static int build_messages(const lore_character *c, const session_history *hist, int first, const char *line,
                          rlai_plugin_message *msgs)
{
    int n = 0;
    msgs[n++] = (rlai_plugin_message){ "system", c->system_prompt };
    for (int i = first; i < hist->n; i++) {
        msgs[n++] = (rlai_plugin_message){ "user", hist->turns[i].user };
        msgs[n++] = (rlai_plugin_message){ "assistant", hist->turns[i].reply };
    }
    msgs[n++] = (rlai_plugin_message){ "user", line };
    return n;
}

/* Prompt length in tokens, or a negative error (unknown). */
static int count_tokens(loremaster *lm, const rlai_plugin_message *msgs, int n)
{
    /* As host->generate tokenizes them: content never parsed for special tokens. */
    if (RLAI_HOST_HAS(lm->host, tokenize_chat))
        return lm->host->tokenize_chat(lm->self, msgs, n, true, NULL, 0);
    char *text = NULL;
    int rc = lm->host->apply_chat(lm->self, msgs, n, true, &text);
    if (rc >= 0)
        rc = lm->host->tokenize(lm->self, text, true, true, NULL, 0);
    lm->host->free(text);
    return rc;
}

static int talk(rlai_call *call, const cJSON *params, void *user)
{
    static const char *const keys[] = { "character", "message", "session", "temperature", "seed",
                                        "max_tokens", NULL };
    loremaster *lm = user;
    const rlai_host_api *h = lm->host;
    char err[512];
    if (rlai_json_check_keys(params, keys, err, sizeof err))
        return h->reply_error(call, RLAI_ERR_INVALID_ARG, "%s", err);

    const cJSON *jc = cJSON_GetObjectItemCaseSensitive(params, "character");
    const cJSON *jm = cJSON_GetObjectItemCaseSensitive(params, "message");
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(params, "session");
    if (!cJSON_IsString(jc))
        return h->reply_error(call, RLAI_ERR_INVALID_ARG, "\"character\" (a string, the character's id) is required");
    const lore_character *c = lorepack_find(&lm->lore, jc->valuestring);
    if (!c) {
        char ids[1024];
        lorepack_ids(&lm->lore, ids, sizeof ids);
        return h->reply_error(call, RLAI_ERR_NOT_FOUND, "unknown character \"%.64s\"; known characters: %s",
                              jc->valuestring, ids);
    }
    if (!cJSON_IsString(jm))
        return h->reply_error(call, RLAI_ERR_INVALID_ARG, "\"message\" (a string, what the player says) is required");
    const char *line = jm->valuestring;
    size_t line_len = strlen(line);
    if (line_len > (size_t)lm->max_message_bytes)
        return h->reply_error(call, RLAI_ERR_TOO_LARGE, "message is %zu bytes; at most %d are accepted", line_len,
                              lm->max_message_bytes);
    bool empty = true;
    for (const char *p = line; *p && empty; p++)
        empty = *p == ' ' || *p == '\t' || *p == '\n' || *p == '\r';
    if (empty)
        return h->reply_error(call, RLAI_ERR_INVALID_ARG, "message is empty");
    const char *sid = NULL;
    if (js && !cJSON_IsNull(js)) {
        if (!cJSON_IsString(js) || !session_id_ok(js->valuestring))
            return h->reply_error(call, RLAI_ERR_INVALID_ARG,
                                  "\"session\" must be 1..%d printable ASCII characters without spaces",
                                  SESSION_MAX_ID);
        sid = js->valuestring;
    }

    rlai_gen_request req;
    memset(&req, 0, sizeof req);
    req.temperature = c->sampling.temperature >= 0 ? c->sampling.temperature : DEFAULT_TEMPERATURE;
    if (lm->temperature >= 0)
        req.temperature = lm->temperature;
    req.max_tokens = lm->max_tokens ? lm->max_tokens
                     : c->sampling.max_tokens > 0 ? c->sampling.max_tokens : DEFAULT_MAX_TOKENS;
    req.top_p = c->sampling.top_p > 0 ? c->sampling.top_p : 0;
    req.repeat_penalty = c->sampling.repeat_penalty > 0 ? c->sampling.repeat_penalty : 0;
    const cJSON *jseed = cJSON_GetObjectItemCaseSensitive(params, "seed");
    if (jseed) {
        if (!cJSON_IsNumber(jseed) || jseed->valuedouble < 0 || jseed->valuedouble > 9007199254740992.0 ||
            jseed->valuedouble != (double)(uint64_t)jseed->valuedouble)
            return h->reply_error(call, RLAI_ERR_INVALID_ARG, "\"seed\" must be a non-negative integer");
        req.seed = (uint64_t)jseed->valuedouble;
    } else {
        req.seed = fresh_seed();
    }
    if (rlai_json_opt_float(params, "temperature", 0, 2, &req.temperature, err, sizeof err) ||
        rlai_json_opt_int(params, "max_tokens", 1, 4096, &req.max_tokens, err, sizeof err))
        return h->reply_error(call, RLAI_ERR_INVALID_ARG, "%s", err);
    req.stream = true;
    req.model = lm->model;

    session_history hist;
    memset(&hist, 0, sizeof hist);
    if (sid) {
        int rc = session_store_snapshot(lm->store, sid, c->id, &hist);
        if (rc)
            return h->reply_error(call, rc, "session store: %s", h->strerror(rc));
    }
    rlai_plugin_message *msgs = malloc((size_t)(2 + 2 * hist.n) * sizeof *msgs);
    if (!msgs) {
        session_history_free(&hist);
        return h->reply_error(call, RLAI_ERR_NOMEM, "out of memory");
    }

    /* Leave out the oldest turns until prompt + reply fit the context. */
    int drop = 0, n_msgs;
    for (;;) {
        n_msgs = build_messages(c, &hist, drop, line, msgs);
        if (lm->context_tokens <= 0 || drop == hist.n)
            break;
        int nt = count_tokens(lm, msgs, n_msgs);
        /* Room for the reply: max_tokens, but never more than half the
         * context (the engine stops a reply at the context's end anyway). */
        int reserve = req.max_tokens < lm->context_tokens / 2 ? req.max_tokens : lm->context_tokens / 2;
        if (nt < 0 || (nt + reserve <= lm->context_tokens &&
                       (lm->max_prompt_tokens <= 0 || nt <= lm->max_prompt_tokens)))
            break;
        drop++;
    }

    rlai_gen_result res;
    int rc;
    for (;;) {
        memset(&res, 0, sizeof res);
        req.messages = msgs;
        req.n_messages = n_msgs;
        rc = h->generate(call, &req, sizeof req, &res);
        /* The prompt was refused before anything streamed (a limit the
         * count above did not see): shed half the remaining history. */
        if ((rc == RLAI_ERR_TOO_LARGE || rc == RLAI_ERR_CONTEXT_FULL) && drop < hist.n) {
            drop += (hist.n - drop + 1) / 2;
            n_msgs = build_messages(c, &hist, drop, line, msgs);
            continue;
        }
        break;
    }
    free(msgs);
    if (rc < 0) {
        session_history_free(&hist);
        h->free(res.text);
        if (rc == RLAI_ERR_NOT_IMPLEMENTED)
            return h->reply_error(call, rc, "no model is loaded: %s (start rlai serve with -m MODEL)",
                                  h->strerror(rc));
        return h->reply_error(call, rc, "generation failed: %s", h->strerror(rc));
    }
    const char *reply = res.text ? res.text : "";
    bool cancelled = res.stop && strcmp(res.stop, "cancelled") == 0;
    int turn = hist.n_total + 1;
    if (sid && !cancelled) {
        int t;
        int arc = session_store_append(lm->store, sid, c->id, hist.serial, line, reply, drop, &t);
        if (arc == 0)
            turn = t;
        else if (arc != RLAI_ERR_NOT_FOUND)
            h->log(lm->self, RLAI_LOG_WARN, "session %s: turn not stored: %s", sid, h->strerror(arc));
    }
    session_history_free(&hist);
    if (cancelled) {
        h->free(res.text);
        return 0;
    }

    cJSON *r = cJSON_CreateObject();
    if (r) {
        cJSON_AddStringToObject(r, "character", c->id);
        cJSON_AddStringToObject(r, "name", c->name);
        if (sid)
            cJSON_AddStringToObject(r, "session", sid);
        else
            cJSON_AddNullToObject(r, "session");
        cJSON_AddStringToObject(r, "reply", reply);
        cJSON_AddNumberToObject(r, "turn", turn);
        cJSON_AddNumberToObject(r, "prompt_tokens", res.prompt_tokens);
        cJSON_AddNumberToObject(r, "reused_tokens", res.reused_tokens);
        cJSON_AddNumberToObject(r, "gen_tokens", res.gen_tokens);
        cJSON_AddNumberToObject(r, "dropped_turns", drop);
        cJSON_AddNumberToObject(r, "seed", (double)req.seed);
        cJSON_AddStringToObject(r, "stop", res.stop ? res.stop : "");
    }
    h->free(res.text);
    if (!r)
        return h->reply_error(call, RLAI_ERR_NOMEM, "out of memory");
    h->reply_json(call, r);
    return 0;
}

/* ---- loremaster.characters / loremaster.reset ---------------------------- */

static int characters(rlai_call *call, const cJSON *params, void *user)
{
    static const char *const keys[] = { NULL };
    loremaster *lm = user;
    char err[256];
    if (rlai_json_check_keys(params, keys, err, sizeof err))
        return lm->host->reply_error(call, RLAI_ERR_INVALID_ARG, "%s", err);
    cJSON *r = cJSON_CreateObject();
    cJSON *arr = r ? cJSON_AddArrayToObject(r, "characters") : NULL;
    bool ok = arr != NULL;
    for (int i = 0; ok && i < lm->lore.n; i++) {
        const lore_character *c = &lm->lore.chars[i];
        cJSON *o = cJSON_CreateObject();
        ok = o && cJSON_AddItemToArray(arr, o);
        if (!ok) {
            cJSON_Delete(o);
            break;
        }
        ok = cJSON_AddStringToObject(o, "id", c->id) && cJSON_AddStringToObject(o, "name", c->name) &&
             cJSON_AddStringToObject(o, "title", c->title) && cJSON_AddStringToObject(o, "world", c->world) &&
             cJSON_AddNumberToObject(o, "lore_tokens", lm->cs[i].lore_tokens) &&
             cJSON_AddNumberToObject(o, "pinned_tokens", lm->cs[i].pinned_tokens);
    }
    if (!ok) {
        cJSON_Delete(r);
        return lm->host->reply_error(call, RLAI_ERR_NOMEM, "out of memory");
    }
    lm->host->reply_json(call, r);
    return 0;
}

static int reset(rlai_call *call, const cJSON *params, void *user)
{
    static const char *const keys[] = { "session", NULL };
    loremaster *lm = user;
    char err[256];
    if (rlai_json_check_keys(params, keys, err, sizeof err))
        return lm->host->reply_error(call, RLAI_ERR_INVALID_ARG, "%s", err);
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(params, "session");
    if (!cJSON_IsString(js) || !session_id_ok(js->valuestring))
        return lm->host->reply_error(call, RLAI_ERR_INVALID_ARG,
                                     "\"session\" (1..%d printable ASCII characters) is required", SESSION_MAX_ID);
    cJSON *r = cJSON_CreateObject();
    if (!r || !cJSON_AddBoolToObject(r, "reset", session_store_reset(lm->store, js->valuestring)) ||
        !cJSON_AddStringToObject(r, "session", js->valuestring)) {
        cJSON_Delete(r);
        return lm->host->reply_error(call, RLAI_ERR_NOMEM, "out of memory");
    }
    lm->host->reply_json(call, r);
    return 0;
}

/* ---- entry points --------------------------------------------------------- */

static const char TALK_SCHEMA[] =
    "{\"type\":\"object\",\"properties\":{"
    "\"character\":{\"type\":\"string\",\"description\":\"Id of the character to speak to (see "
    "loremaster.characters), e.g. \\\"brannoc\\\".\"},"
    "\"message\":{\"type\":\"string\",\"minLength\":1,\"description\":\"What the player says to the "
    "character, in plain words.\"},"
    "\"session\":{\"type\":\"string\",\"maxLength\":128,\"description\":\"Conversation id. Reuse the same id "
    "on every turn so the character remembers what was said; omit it for a one-off line that is not "
    "remembered.\"},"
    "\"temperature\":{\"type\":\"number\",\"minimum\":0,\"maximum\":2,\"description\":\"Sampling "
    "temperature (default from the lore pack, else 0.8; 0 = deterministic).\"},"
    "\"seed\":{\"type\":\"integer\",\"minimum\":0,\"description\":\"Random seed for reproducible "
    "replies.\"},"
    "\"max_tokens\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":4096,\"description\":\"Longest reply in "
    "tokens (default from the lore pack).\"}},"
    "\"required\":[\"character\",\"message\"],\"additionalProperties\":false}";

static const char CHARACTERS_SCHEMA[] = "{\"type\":\"object\",\"properties\":{},\"additionalProperties\":false}";

static const char RESET_SCHEMA[] =
    "{\"type\":\"object\",\"properties\":{\"session\":{\"type\":\"string\",\"maxLength\":128,"
    "\"description\":\"The conversation id to forget.\"}},\"required\":[\"session\"],"
    "\"additionalProperties\":false}";

RLAI_PLUGIN_EXPORT int rlai_plugin_init(const rlai_host_api *host, rlai_plugin *self, char **errmsg)
{
    char err[1024] = "";
    loremaster *lm = calloc(1, sizeof *lm);
    if (!lm) {
        if (errmsg)
            *errmsg = host_strdup(host, "out of memory");
        return RLAI_ERR_NOMEM;
    }
    lm->host = host;
    lm->self = self;
    lorepack_set_init(&lm->lore);
    const cJSON *cfg = host->config(self);
    int rc = read_config(lm, cfg, err, sizeof err);
    if (rc == 0)
        rc = load_packs(lm, cfg, err, sizeof err);
    if (rc == 0 && (rc = session_store_new(lm->max_sessions, lm->max_turns, &lm->store)) != 0)
        snprintf(err, sizeof err, "session store: %s", host->strerror(rc));
    if (rc == 0 && !(lm->cs = calloc((size_t)lm->lore.n, sizeof *lm->cs))) {
        rc = RLAI_ERR_NOMEM;
        snprintf(err, sizeof err, "out of memory");
    }
    if (rc == 0) {
        const rlai_command_desc cmds[] = {
            { .name = "loremaster.talk",
              .description =
                  "Say something to a character of the game world (an NPC from the loaded lore packs) and get "
                  "their reply, spoken in character and streamed as it is written. The result has the full "
                  "reply and the turn number. Pass the same session id on every turn of a conversation so the "
                  "character remembers it; leave it out for a single line. Call loremaster.characters first to "
                  "learn the character ids.",
              .params_schema = TALK_SCHEMA, .handler = talk, .user = lm,
              .flags = RLAI_CMD_STREAMS | RLAI_CMD_USES_ENGINE },
            { .name = "loremaster.characters",
              .description = "List the characters LoreMaster can play: id (for loremaster.talk), name, a short "
                             "title, their world, and how many lore tokens are pinned in the prefix cache.",
              .params_schema = CHARACTERS_SCHEMA, .handler = characters, .user = lm },
            { .name = "loremaster.reset",
              .description = "Forget a conversation: drops what every character remembers of the given session "
                             "id, so the next loremaster.talk with it starts fresh. Returns reset: false when the "
                             "session was unknown.",
              .params_schema = RESET_SCHEMA, .handler = reset, .user = lm },
        };
        for (size_t i = 0; rc == 0 && i < sizeof cmds / sizeof cmds[0]; i++)
            if ((rc = host->register_command(self, &cmds[i], sizeof cmds[i])) != 0)
                snprintf(err, sizeof err, "cannot register %s: %s", cmds[i].name, host->strerror(rc));
    }
    /* Every character is a chat model "loremaster/<id>" (ABI 1.2): OpenAI
     * clients pick it as the model and the host calls loremaster.talk. */
    for (int i = 0; rc == 0 && i < lm->lore.n && RLAI_HOST_HAS(host, register_chat_model); i++) {
        const lore_character *c = &lm->lore.chars[i];
        char model[300], params[300], desc[400];
        cJSON *pj = cJSON_CreateObject();
        char *printed = pj && cJSON_AddStringToObject(pj, "character", c->id) ? cJSON_PrintUnformatted(pj) : NULL;
        cJSON_Delete(pj);
        snprintf(model, sizeof model, "loremaster/%s", c->id);
        snprintf(params, sizeof params, "%s", printed ? printed : "{}");
        free(printed);
        snprintf(desc, sizeof desc, "%s%s%s (LoreMaster character)", c->name, c->title[0] ? ", " : "", c->title);
        int mrc = host->register_chat_model(self, model, "loremaster.talk", params, desc);
        if (mrc != 0)   /* the character stays reachable through loremaster.talk */
            host->log(self, RLAI_LOG_WARN, "%s: not offered as a chat model: %s", c->id, host->strerror(mrc));
    }
    if (rc != 0) {
        if (errmsg)
            *errmsg = host_strdup(host, err[0] ? err : host->strerror(rc));
        lm_free(lm);
        return rc;
    }
    pin_lore(lm);
    host->set_state(self, lm);
    return 0;
}

RLAI_PLUGIN_EXPORT void rlai_plugin_fini(void *state)
{
    /* The host unpins what this plugin pinned when it unloads. */
    lm_free(state);
}
