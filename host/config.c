/* config.c - daemon configuration (see config.h). */
#include "config.h"
#include "http.h"
#include "upstream.h"
#include "rlai/client.h"
#include "rlai/engine.h"
#include "rlai/error.h"
#include "rlai/protocol.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int rlai_config_set_str(char **field, const char *s)
{
    char *copy = NULL;
    if (s && *s) {
        copy = strdup(s);
        if (!copy)
            return RLAI_ERR_NOMEM;
    }
    free(*field);
    *field = copy;
    return 0;
}

int rlai_config_defaults(rlai_config *c, const char *default_model)
{
    memset(c, 0, sizeof(*c));
    char buf[PATH_MAX + 16];
    int rc = rlai_config_set_str(&c->model, default_model);
    if (rc == 0 && rlai_default_zmq_endpoint(buf, sizeof(buf)) == 0)
        rc = rlai_config_set_str(&c->zmq, buf);
    if (rc == 0 && rlai_default_pipe_endpoint(buf, sizeof(buf)) == 0) {
        const char *p = strncmp(buf, "unix://", 7) == 0 ? buf + 7 : buf;
        rc = rlai_config_set_str(&c->pipe, p);
    }
    if (rc == 0)
        rc = rlai_config_set_str(&c->http, RLAI_HTTP_DEFAULT);
    c->max_frame = RLAI_PROTO_MAX_FRAME;
    c->max_prompt_tokens = 4096;
    c->max_inflight_client = 8;
    c->max_inflight_total = 64;
    c->plugin_call_timeout_s = 60;
    c->shutdown_timeout_s = 5;
    c->http_max_connections = RLAI_HTTP_DEFAULT_MAX_CONNECTIONS;
    c->http_max_connections_per_ip = 0;   /* auto (rlai_http_params) */
    c->http_header_timeout_s = RLAI_HTTP_DEFAULT_HEADER_TIMEOUT_S;
    return rc;
}

int rlai_config_add_cors_origin(rlai_config *c, const char *origin)
{
    char **n = realloc(c->cors_origins, sizeof(char *) * (size_t)(c->n_cors_origins + 1));
    if (!n)
        return RLAI_ERR_NOMEM;
    c->cors_origins = n;
    if (!(n[c->n_cors_origins] = strdup(origin ? origin : "")))
        return RLAI_ERR_NOMEM;
    c->n_cors_origins++;
    return 0;
}

void rlai_config_clear_cors_origins(rlai_config *c)
{
    for (int i = 0; i < c->n_cors_origins; i++)
        free(c->cors_origins[i]);
    free(c->cors_origins);
    c->cors_origins = NULL;
    c->n_cors_origins = 0;
}

int rlai_config_add_plugin_dir(rlai_config *c, const char *dir)
{
    char **n = realloc(c->plugin_dirs_extra, sizeof(char *) * (size_t)(c->n_plugin_dirs_extra + 1));
    if (!n)
        return RLAI_ERR_NOMEM;
    c->plugin_dirs_extra = n;
    if (!(n[c->n_plugin_dirs_extra] = strdup(dir ? dir : "")))
        return RLAI_ERR_NOMEM;
    c->n_plugin_dirs_extra++;
    return 0;
}

void rlai_config_free(rlai_config *c)
{
    free(c->model);
    free(c->zmq);
    free(c->zmq_tcp);
    free(c->device);
    free(c->mmproj);
    free(c->draft_model);
    free(c->pipe);
    free(c->http);
    free(c->plugins_dir);
    free(c->plugin_config);
    free(c->api_key);
    free(c->api_key_file);
    rlai_config_clear_cors_origins(c);
    for (int i = 0; i < c->n_plugin_dirs_extra; i++)
        free(c->plugin_dirs_extra[i]);
    free(c->plugin_dirs_extra);
    for (int i = 0; i < c->n_upstreams; i++)
        rlai_upstream_config_clear(&c->upstreams[i]);
    free(c->upstreams);
    memset(c, 0, sizeof(*c));
}

static int get_int(const cJSON *item, const char *key, int lo, int hi, int *out, char *err, size_t errlen)
{
    if (!cJSON_IsNumber(item) || item->valuedouble != (double)(long long)item->valuedouble ||
        item->valuedouble < lo || item->valuedouble > hi)
        return rlai_errf(err, errlen, RLAI_ERR_FORMAT, "config: '%s' must be an integer in [%d, %d]", key, lo, hi);
    *out = (int)item->valuedouble;
    return 0;
}

static int get_str(const cJSON *item, const char *key, char **out, char *err, size_t errlen)
{
    if (cJSON_IsNull(item))
        return rlai_config_set_str(out, NULL);
    if (!cJSON_IsString(item))
        return rlai_errf(err, errlen, RLAI_ERR_FORMAT, "config: '%s' must be a string", key);
    return rlai_config_set_str(out, item->valuestring);
}

/* One "upstreams" entry into u (initialised by the caller). */
static int load_upstream(const cJSON *o, int idx, rlai_upstream_config *u, char *err, size_t errlen)
{
    if (!cJSON_IsObject(o))
        return rlai_errf(err, errlen, RLAI_ERR_FORMAT, "config: 'upstreams[%d]' must be an object", idx);
    const cJSON *f;
    char key[96];
    int rc = 0;
    cJSON_ArrayForEach(f, o) {
        const char *k = f->string;
        snprintf(key, sizeof(key), "upstreams[%d].%s", idx, k);
        struct { const char *k; int *v; int lo, hi; } ints[] = {
            { "max_concurrency", &u->max_concurrency, 1, 4096 }, { "max_queue", &u->max_queue, 0, 65536 },
            { "connect_timeout_ms", &u->connect_timeout_ms, 1, 600000 },
            { "first_token_timeout_ms", &u->first_token_timeout_ms, 1, 3600000 },
            { "stall_timeout_ms", &u->stall_timeout_ms, 1, 3600000 }, { "max_retries", &u->max_retries, 0, 10 },
            { "retry_backoff_ms", &u->retry_backoff_ms, 0, 60000 },
            { "breaker_failures", &u->breaker_failures, 1, 1000 },
            { "breaker_cooldown_ms", &u->breaker_cooldown_ms, 1, 3600000 },
        };
        bool done = false;
        for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++)
            if (!strcmp(k, ints[i].k)) {
                rc = get_int(f, key, ints[i].lo, ints[i].hi, ints[i].v, err, errlen);
                done = true;
            }
        if (done) {
        } else if (!strcmp(k, "name")) {
            rc = get_str(f, key, &u->name, err, errlen);
        } else if (!strcmp(k, "base_url")) {
            rc = get_str(f, key, &u->base_url, err, errlen);
        } else if (!strcmp(k, "api_key_env")) {
            rc = get_str(f, key, &u->api_key_env, err, errlen);
        } else if (!strcmp(k, "api_key_file")) {
            rc = get_str(f, key, &u->api_key_file, err, errlen);
        } else if (!strcmp(k, "spill_model")) {
            rc = get_str(f, key, &u->spill_model, err, errlen);
        } else if (!strcmp(k, "proxy")) {
            rc = get_str(f, key, &u->proxy, err, errlen);
        } else if (!strcmp(k, "ca_file")) {
            rc = get_str(f, key, &u->ca_file, err, errlen);
        } else if (!strcmp(k, "sampling_extras")) {
            if (!cJSON_IsBool(f))
                rc = rlai_errf(err, errlen, RLAI_ERR_FORMAT, "config: '%s' must be a boolean", key);
            else
                u->sampling_extras = cJSON_IsTrue(f);
        } else if (!strcmp(k, "models")) {
            if (!cJSON_IsObject(f))
                return rlai_errf(err, errlen, RLAI_ERR_FORMAT,
                            "config: '%s' must be an object {\"shown name\": \"upstream's name\"}", key);
            int n = cJSON_GetArraySize(f);
            u->models = calloc((size_t)(n > 0 ? n : 1), sizeof(*u->models));
            if (!u->models)
                return RLAI_ERR_NOMEM;
            const cJSON *m;
            cJSON_ArrayForEach(m, f) {
                if (!cJSON_IsString(m) || !m->valuestring[0] || !m->string[0])
                    return rlai_errf(err, errlen, RLAI_ERR_FORMAT, "config: '%s.%s' must be a non-empty string", key,
                                m->string);
                rlai_upstream_model *um = &u->models[u->n_models++];
                if (!(um->name = strdup(m->string)) || !(um->remote = strdup(m->valuestring)))
                    return RLAI_ERR_NOMEM;
            }
        } else {
            rc = rlai_errf(err, errlen, RLAI_ERR_FORMAT, "config: unknown key '%s'", key);
        }
        if (rc < 0)
            return rc;
    }
    rc = rlai_upstream_config_check(u, err, errlen);
    return rc < 0 ? RLAI_ERR_FORMAT : 0;
}

static int load_upstreams(rlai_config *c, const cJSON *a, char *err, size_t errlen)
{
    if (!cJSON_IsArray(a))
        return rlai_errf(err, errlen, RLAI_ERR_FORMAT, "config: 'upstreams' must be a list of objects");
    for (int i = 0; i < c->n_upstreams; i++)
        rlai_upstream_config_clear(&c->upstreams[i]);
    free(c->upstreams);
    c->upstreams = NULL;
    c->n_upstreams = 0;
    int n = cJSON_GetArraySize(a);
    if (n > 64)
        return rlai_errf(err, errlen, RLAI_ERR_FORMAT, "config: at most 64 upstreams");
    if (n == 0)
        return 0;
    c->upstreams = calloc((size_t)n, sizeof(*c->upstreams));
    if (!c->upstreams)
        return RLAI_ERR_NOMEM;
    const cJSON *o;
    cJSON_ArrayForEach(o, a) {
        rlai_upstream_config *u = &c->upstreams[c->n_upstreams];
        rlai_upstream_config_init(u);
        c->n_upstreams++;
        int rc = load_upstream(o, c->n_upstreams - 1, u, err, errlen);
        if (rc < 0)
            return rc;
        for (int k = 0; k < c->n_upstreams - 1; k++)
            if (!strcmp(c->upstreams[k].name, u->name))
                return rlai_errf(err, errlen, RLAI_ERR_FORMAT, "config: upstream name '%s' is used twice", u->name);
    }
    return 0;
}

static int load_routing(rlai_config *c, const cJSON *o, char *err, size_t errlen)
{
    if (!cJSON_IsObject(o))
        return rlai_errf(err, errlen, RLAI_ERR_FORMAT, "config: 'routing' must be an object");
    const cJSON *f;
    cJSON_ArrayForEach(f, o) {
        const char *k = f->string;
        int rc = 0;
        if (!strcmp(k, "spill_queued")) {
            rc = get_int(f, "routing.spill_queued", 0, 65536, &c->route_spill_queued, err, errlen);
        } else if (!strcmp(k, "spill_long_prompts") || !strcmp(k, "affinity")) {
            if (!cJSON_IsBool(f))
                return rlai_errf(err, errlen, RLAI_ERR_FORMAT, "config: 'routing.%s' must be a boolean", k);
            if (!strcmp(k, "affinity"))
                c->route_no_affinity = !cJSON_IsTrue(f);
            else
                c->route_no_spill_long = !cJSON_IsTrue(f);
        } else {
            rc = rlai_errf(err, errlen, RLAI_ERR_FORMAT, "config: unknown key 'routing.%s'", k);
        }
        if (rc < 0)
            return rc;
    }
    return 0;
}

int rlai_config_load_json(rlai_config *c, const char *json, char *err, size_t errlen)
{
    cJSON *root = cJSON_Parse(json);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        return rlai_errf(err, errlen, RLAI_ERR_FORMAT, "config: invalid JSON near '%.20s'", at ? at : "?");
    }
    int rc = 0;
    if (!cJSON_IsObject(root)) {
        rc = rlai_errf(err, errlen, RLAI_ERR_FORMAT, "config: top level must be an object");
        goto out;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, root) {
        const char *k = it->string;
        if (!strcmp(k, "model")) {
            rc = get_str(it, k, &c->model, err, errlen);
        } else if (!strcmp(k, "threads")) {
            rc = get_int(it, k, 0, 256, &c->threads, err, errlen);
        } else if (!strcmp(k, "context")) {
            rc = get_int(it, k, 0, 1 << 20, &c->context, err, errlen);
        } else if (!strcmp(k, "kv_blocks")) {
            rc = get_int(it, k, 0, 1 << 24, &c->kv_blocks, err, errlen);
        } else if (!strcmp(k, "device")) {
            rc = get_str(it, k, &c->device, err, errlen);
        } else if (!strcmp(k, "mmproj")) {
            rc = get_str(it, k, &c->mmproj, err, errlen);
        } else if (!strcmp(k, "draft_model")) {
            rc = get_str(it, k, &c->draft_model, err, errlen);
        } else if (!strcmp(k, "spec")) {
            int mode = cJSON_IsString(it) ? rlai_spec_mode_parse(it->valuestring) : RLAI_ERR_INVALID_ARG;
            if (mode < 0)
                rc = rlai_errf(err, errlen, RLAI_ERR_FORMAT, "config: 'spec' %s", rlai_spec_mode_error(mode));
            else
                c->spec = mode;
        } else if (!strcmp(k, "spec_max_draft")) {
            rc = get_int(it, k, 1, 16, &c->spec_max_draft, err, errlen);
        } else if (!strcmp(k, "spec_lookup_min")) {
            rc = get_int(it, k, -1, 8, &c->spec_lookup_min, err, errlen);
        } else if (!strcmp(k, "kv_type")) {
            if (cJSON_IsString(it) && !strcmp(it->valuestring, "f16"))
                c->kv_q8_0 = false;
            else if (cJSON_IsString(it) && !strcmp(it->valuestring, "q8_0"))
                c->kv_q8_0 = true;
            else
                rc = rlai_errf(err, errlen, RLAI_ERR_FORMAT, "config: 'kv_type' must be \"f16\" or \"q8_0\"");
        } else if (!strcmp(k, "endpoints") && cJSON_IsObject(it)) {
            const cJSON *e;
            cJSON_ArrayForEach(e, it) {
                const char *ek = e->string;
                if (!strcmp(ek, "zmq"))
                    rc = get_str(e, "endpoints.zmq", &c->zmq, err, errlen);
                else if (!strcmp(ek, "zmq_tcp"))
                    rc = get_str(e, "endpoints.zmq_tcp", &c->zmq_tcp, err, errlen);
                else if (!strcmp(ek, "pipe"))
                    rc = get_str(e, "endpoints.pipe", &c->pipe, err, errlen);
                else if (!strcmp(ek, "http"))
                    rc = get_str(e, "endpoints.http", &c->http, err, errlen);
                else if (!strcmp(ek, "allow_remote")) {
                    if (!cJSON_IsBool(e))
                        rc = rlai_errf(err, errlen, RLAI_ERR_FORMAT, "config: 'endpoints.allow_remote' must be a boolean");
                    else
                        c->allow_remote = cJSON_IsTrue(e);
                } else
                    rc = rlai_errf(err, errlen, RLAI_ERR_FORMAT, "config: unknown key 'endpoints.%s'", ek);
                if (rc < 0)
                    goto out;
            }
        } else if (!strcmp(k, "limits") && cJSON_IsObject(it)) {
            const cJSON *l;
            cJSON_ArrayForEach(l, it) {
                const char *lk = l->string;
                int v = 0;
                if (!strcmp(lk, "max_frame_bytes")) {
                    rc = get_int(l, "limits.max_frame_bytes", 64, (int)RLAI_PROTO_MAX_FRAME, &v, err, errlen);
                    c->max_frame = (size_t)v;
                } else if (!strcmp(lk, "max_prompt_tokens")) {
                    rc = get_int(l, "limits.max_prompt_tokens", 1, 1 << 20, &c->max_prompt_tokens, err, errlen);
                } else if (!strcmp(lk, "max_inflight_per_client")) {
                    rc = get_int(l, "limits.max_inflight_per_client", 1, 4096, &c->max_inflight_client, err, errlen);
                } else if (!strcmp(lk, "request_timeout_s")) {
                    rc = get_int(l, "limits.request_timeout_s", 0, 7 * 24 * 3600, &c->request_timeout_s, err, errlen);
                } else if (!strcmp(lk, "max_inflight_total")) {
                    rc = get_int(l, "limits.max_inflight_total", 1, 65536, &c->max_inflight_total, err, errlen);
                } else {
                    rc = rlai_errf(err, errlen, RLAI_ERR_FORMAT, "config: unknown key 'limits.%s'", lk);
                }
                if (rc < 0)
                    goto out;
            }
        } else if (!strcmp(k, "shutdown_timeout_s")) {
            rc = get_int(it, "shutdown_timeout_s", 1, 3600, &c->shutdown_timeout_s, err, errlen);
        } else if (!strcmp(k, "prefix_cache")) {
            if (!cJSON_IsBool(it))
                rc = rlai_errf(err, errlen, RLAI_ERR_FORMAT, "config: 'prefix_cache' must be a boolean");
            else
                c->no_prefix_cache = !cJSON_IsTrue(it);
        } else if (!strcmp(k, "plugins") && cJSON_IsObject(it)) {
            const cJSON *pl;
            cJSON_ArrayForEach(pl, it) {
                const char *pk = pl->string;
                if (!strcmp(pk, "dir")) {
                    rc = get_str(pl, "plugins.dir", &c->plugins_dir, err, errlen);
                } else if (!strcmp(pk, "enabled")) {
                    if (!cJSON_IsBool(pl))
                        rc = rlai_errf(err, errlen, RLAI_ERR_FORMAT, "config: 'plugins.enabled' must be a boolean");
                    else
                        c->plugins_off = !cJSON_IsTrue(pl);
                } else if (!strcmp(pk, "workers")) {
                    rc = get_int(pl, "plugins.workers", 1, 64, &c->plugin_workers, err, errlen);
                } else if (!strcmp(pk, "call_timeout_s")) {
                    rc = get_int(pl, "plugins.call_timeout_s", 0, 86400, &c->plugin_call_timeout_s, err, errlen);
                } else if (!strcmp(pk, "max_queue")) {
                    rc = get_int(pl, "plugins.max_queue", 1, 65536, &c->plugin_max_queue, err, errlen);
                } else if (!strcmp(pk, "config")) {
                    if (!cJSON_IsObject(pl)) {
                        rc = rlai_errf(err, errlen, RLAI_ERR_FORMAT, "config: 'plugins.config' must be an object");
                    } else {
                        char *txt = cJSON_PrintUnformatted(pl);
                        if (!txt)
                            rc = RLAI_ERR_NOMEM;
                        free(c->plugin_config);
                        c->plugin_config = txt;
                    }
                } else {
                    rc = rlai_errf(err, errlen, RLAI_ERR_FORMAT, "config: unknown key 'plugins.%s'", pk);
                }
                if (rc < 0)
                    goto out;
            }
        } else if (!strcmp(k, "auth") && cJSON_IsObject(it)) {
            const cJSON *a;
            cJSON_ArrayForEach(a, it) {
                const char *ak = a->string;
                if (!strcmp(ak, "enabled")) {
                    if (!cJSON_IsBool(a))
                        rc = rlai_errf(err, errlen, RLAI_ERR_FORMAT, "config: 'auth.enabled' must be a boolean");
                    else
                        c->auth_off = cJSON_IsFalse(a);
                } else if (!strcmp(ak, "api_key")) {
                    rc = get_str(a, "auth.api_key", &c->api_key, err, errlen);
                } else if (!strcmp(ak, "api_key_file")) {
                    rc = get_str(a, "auth.api_key_file", &c->api_key_file, err, errlen);
                } else {
                    rc = rlai_errf(err, errlen, RLAI_ERR_FORMAT, "config: unknown key 'auth.%s'", ak);
                }
                if (rc < 0)
                    break;
            }
        } else if (!strcmp(k, "http") && cJSON_IsObject(it)) {
            const cJSON *hk;
            cJSON_ArrayForEach(hk, it) {
                const char *n = hk->string;
                if (!strcmp(n, "cors_origins")) {
                    const cJSON *o;
                    if (!cJSON_IsArray(hk))
                        rc = rlai_errf(err, errlen, RLAI_ERR_FORMAT, "config: 'http.cors_origins' must be a list of strings");
                    rlai_config_clear_cors_origins(c);
                    cJSON_ArrayForEach(o, hk) {
                        if (rc < 0)
                            break;
                        if (!cJSON_IsString(o))
                            rc = rlai_errf(err, errlen, RLAI_ERR_FORMAT,
                                      "config: 'http.cors_origins' must be a list of strings");
                        else
                            rc = rlai_config_add_cors_origin(c, o->valuestring);
                    }
                } else if (!strcmp(n, "max_connections")) {
                    rc = get_int(hk, "http.max_connections", 1, 65536, &c->http_max_connections, err, errlen);
                } else if (!strcmp(n, "max_connections_per_ip")) {
                    rc = get_int(hk, "http.max_connections_per_ip", 0, 65536, &c->http_max_connections_per_ip, err,
                                 errlen);
                } else if (!strcmp(n, "header_timeout_s")) {
                    rc = get_int(hk, "http.header_timeout_s", 1, 3600, &c->http_header_timeout_s, err, errlen);
                } else {
                    rc = rlai_errf(err, errlen, RLAI_ERR_FORMAT, "config: unknown key 'http.%s'", n);
                }
                if (rc < 0)
                    goto out;
            }
        } else if (!strcmp(k, "upstreams")) {
            rc = load_upstreams(c, it, err, errlen);
        } else if (!strcmp(k, "routing")) {
            rc = load_routing(c, it, err, errlen);
        } else if (!strcmp(k, "endpoints") || !strcmp(k, "limits") || !strcmp(k, "plugins") || !strcmp(k, "auth") ||
                   !strcmp(k, "http")) {
            rc = rlai_errf(err, errlen, RLAI_ERR_FORMAT, "config: '%s' must be an object", k);
        } else {
            rc = rlai_errf(err, errlen, RLAI_ERR_FORMAT, "config: unknown key '%s'", k);
        }
        if (rc < 0)
            goto out;
    }
out:
    cJSON_Delete(root);
    return rc;
}

int rlai_config_load_file(rlai_config *c, const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return rlai_errf(err, errlen, RLAI_ERR_IO, "config: cannot open %s", path);
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 8192;
            if (cap > (1u << 20)) {
                free(buf);
                fclose(f);
                return rlai_errf(err, errlen, RLAI_ERR_TOO_LARGE, "config: %s is larger than 1 MiB", path);
            }
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                return RLAI_ERR_NOMEM;
            }
            buf = nb;
        }
        size_t n = fread(buf + len, 1, cap - len - 1, f);
        len += n;
        if (n == 0)
            break;
    }
    fclose(f);
    buf[len] = 0;
    int rc = rlai_config_load_json(c, buf, err, errlen);
    free(buf);
    return rc;
}

static bool tcp_is_loopback(const char *ep)
{
    const char *host = ep + 6; /* after "tcp://" */
    return !strncmp(host, "127.", 4) || !strncmp(host, "localhost:", 10) || !strncmp(host, "[::1]:", 6);
}

int rlai_config_validate(const rlai_config *c, char *err, size_t errlen)
{
    if (!c->model)
        return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG, "config: no model path");
    if (!c->zmq && !c->zmq_tcp && !c->pipe && !c->http)
        return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG, "config: every endpoint is disabled");
    if (c->zmq && strncmp(c->zmq, "ipc://", 6) != 0 && strncmp(c->zmq, "tcp://", 6) != 0)
        return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG, "config: zmq endpoint '%s' must start with ipc:// or tcp://", c->zmq);
    if (c->zmq_tcp && strncmp(c->zmq_tcp, "tcp://", 6) != 0)
        return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG, "config: zmq_tcp endpoint '%s' must start with tcp://", c->zmq_tcp);
    const char *tcps[2] = { c->zmq && !strncmp(c->zmq, "tcp://", 6) ? c->zmq : NULL, c->zmq_tcp };
    for (int i = 0; i < 2; i++)
        if (tcps[i] && !c->allow_remote && !tcp_is_loopback(tcps[i]))
            return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG,
                        "config: %s is not a loopback address; set endpoints.allow_remote (or --allow-remote) "
                        "to expose the engine beyond this machine", tcps[i]);
    if (c->http) {
        /* "HOST:PORT" or "[V6]:PORT" with a numeric port. */
        const char *colon = c->http[0] == '[' ? strstr(c->http, "]:") : strrchr(c->http, ':');
        const char *port = colon ? colon + (c->http[0] == '[' ? 2 : 1) : NULL;
        bool ok = colon && colon != c->http && port && *port && strlen(port) <= 5 &&
                  strspn(port, "0123456789") == strlen(port) && atoi(port) <= 65535;
        if (!ok)
            return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG, "config: http endpoint '%s' must be ADDR:PORT", c->http);
        bool loop = !strncmp(c->http, "127.", 4) || !strncmp(c->http, "localhost:", 10) ||
                    !strncmp(c->http, "[::1]:", 6);
        if (!loop && !c->allow_remote)
            return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG,
                        "config: http %s is not a loopback address; set endpoints.allow_remote (or --allow-remote) "
                        "to expose the engine beyond this machine", c->http);
    }
    for (int i = 0; i < c->n_cors_origins; i++)
        if (!rlai_http_origin_valid(c->cors_origins[i]))
            return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG,
                        "config: CORS origin '%.200s' must be scheme://host[:port], e.g. https://app.example:8443 "
                        "(no path, no '*')", c->cors_origins[i]);
    if (c->http_max_connections <= 0 || c->http_max_connections_per_ip < 0 || c->http_header_timeout_s <= 0)
        return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG, "config: http limits must be positive");
    if (c->max_prompt_tokens <= 0 || c->max_inflight_client <= 0 || c->max_inflight_total <= 0 || c->max_frame < 64)
        return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG, "config: limits must be positive");
    return 0;
}

uint64_t rlai_config_timeout_ms(uint64_t requested_ms, int cap_s)
{
    uint64_t cap = cap_s > 0 ? (uint64_t)cap_s * 1000u : 0;
    if (requested_ms == 0)
        return cap;
    return cap && cap < requested_ms ? cap : requested_ms;
}
