/* cli_call.c - `rlai call` and `rlai plugins` (see cli_call.h). */
#include "cli_call.h"
#include "api_key.h"
#include "json_msgpack.h"
#include "rlai/client.h"

#include <cjson/cJSON.h>
#include <msgpack.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Sends one request and hands every frame of it to `on_frame` until done
 * or error. Returns the exit code. */
int rlai_cli_connect(const char *endpoint, int timeout_ms, rlai_client **out, char *err, size_t errlen)
{
    rlai_client_options o = {.timeout_ms = timeout_ms};
    char key[RLAI_API_KEY_MAX + 1], path[4096], kerr[512];
    const char *env = getenv("RLAI_API_KEY");
    if (endpoint && !strncmp(endpoint, "tcp://", 6) && !(env && *env) &&
        rlai_api_key_default_path(path, sizeof path) == 0) {
        int rc = rlai_api_key_read_file(path, key, kerr, sizeof kerr);
        if (rc == 0)
            o.api_key = key;
        else if (rc != RLAI_ERR_NOT_FOUND)
            fprintf(stderr, "rlai: not using the API key file: %s\n", kerr);
    }
    int rc = rlai_client_connect_opts(endpoint, &o, out, err, errlen);
    memset(key, 0, sizeof key);
    return rc;
}

typedef void (*frame_fn)(void *user, const rlai_msg *f);

static int round_trip(const char *endpoint, rlai_msg *m, frame_fn on_frame, void *user)
{
    rlai_client *cl;
    char err[512];
    int rc = rlai_cli_connect(endpoint, 2000, &cl, err, sizeof(err));
    if (rc < 0) {
        fprintf(stderr, "rlai: %s\n", err);
        return 1;
    }
    m->version = RLAI_PROTO_VERSION;
    m->id = rlai_client_next_id(cl);
    int status = 1;
    if ((rc = rlai_client_send(cl, m)) < 0) {
        fprintf(stderr, "rlai: %s\n", rlai_strerror(rc));
        rlai_client_close(cl);
        return 1;
    }
    for (;;) {
        rlai_msg f;
        /* Engine jobs may wait in the queue; a dead engine is still noticed
         * within seconds by the client library. */
        if ((rc = rlai_client_recv(cl, -1, &f)) < 0) {
            fprintf(stderr, "rlai: %s\n", rlai_strerror(rc));
            break;
        }
        bool mine = f.id == m->id;
        if (mine)
            on_frame(user, &f);
        if (mine && f.type == RLAI_MSG_DONE)
            status = 0;
        else if (mine && f.type == RLAI_MSG_ERROR)
            fprintf(stderr, "rlai: %s (%s)\n", f.u.error.msg ? f.u.error.msg : "error",
                    f.u.error.name ? f.u.error.name : "?");
        bool end = mine && (f.type == RLAI_MSG_DONE || f.type == RLAI_MSG_ERROR);
        rlai_msg_free(&f);
        if (end)
            break;
    }
    rlai_client_close(cl);
    return status;
}

static cJSON *result_json(const rlai_msg *f)
{
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    cJSON *v = NULL;
    if (msgpack_unpack_next(&up, (const char *)f->u.result.data, f->u.result.len, NULL) == MSGPACK_UNPACK_SUCCESS)
        v = rlai_msgpack_to_json(&up.data);
    msgpack_unpacked_destroy(&up);
    return v;
}

/* ---------------------------------------------------------- call */

typedef struct call_out {
    bool quiet;
    bool text_open;        /* streamed text not yet ended by a newline */
} call_out;

static void call_frame(void *user, const rlai_msg *f)
{
    call_out *o = user;
    if (f->type == RLAI_MSG_TOKEN && f->u.token.text) {
        size_t n = strlen(f->u.token.text);
        fwrite(f->u.token.text, 1, n, stdout);
        fflush(stdout);
        if (n)
            o->text_open = f->u.token.text[n - 1] != '\n';
    } else if (f->type == RLAI_MSG_RESULT) {
        cJSON *v = result_json(f);
        char *txt = v ? cJSON_PrintUnformatted(v) : NULL;
        if (o->text_open) {
            fputc('\n', stdout);
            o->text_open = false;
        }
        printf("%s\n", txt ? txt : "<undecodable result>");
        fflush(stdout);
        free(txt);
        cJSON_Delete(v);
    } else if (f->type == RLAI_MSG_DONE || f->type == RLAI_MSG_ERROR) {
        if (o->text_open) {
            fputc('\n', stdout);
            o->text_open = false;
        }
        if (f->type == RLAI_MSG_DONE && !o->quiet && f->u.done.has_metrics) {
            const rlai_msg_metrics *mm = &f->u.done.metrics;
            fprintf(stderr, "[prompt %u tokens (%u reused), ttft %.1f ms, %u tokens at %.1f tok/s, stop %s]\n",
                    mm->prompt_tokens, mm->reused_tokens, mm->ttft_ms, mm->gen_tokens, mm->decode_tps,
                    f->u.done.stop && *f->u.done.stop ? f->u.done.stop : "-");
        }
    }
}

int rlai_cli_call_main(int argc, char **argv)
{
    const char *endpoint = NULL, *command = NULL, *params = NULL;
    call_out o = { 0 };
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--endpoint") && i + 1 < argc) {
            endpoint = argv[++i];
        } else if (!strcmp(argv[i], "--quiet") || !strcmp(argv[i], "-q")) {
            o.quiet = true;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: rlai call [--endpoint E] [--quiet] plugin.verb ['{\"param\": ...}']\n"
                   "       (see `rlai plugins` for the commands and their parameters)\n");
            return 0;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            command = NULL;
            break;
        } else if (!command) {
            command = argv[i];
        } else if (!params) {
            params = argv[i];
        } else {
            command = NULL;
            break;
        }
    }
    if (!command) {
        fprintf(stderr, "usage: rlai call [--endpoint E] [--quiet] plugin.verb ['{\"param\": ...}']\n"
                        "       (see `rlai plugins` for the commands and their parameters)\n");
        return 2;
    }
    if (params) {
        cJSON *p = cJSON_Parse(params);
        bool ok = cJSON_IsObject(p);
        cJSON_Delete(p);
        if (!ok) {
            fprintf(stderr, "rlai call: parameters must be a JSON object, e.g. '{\"message\": \"hi\"}'\n");
            return 2;
        }
    }
    rlai_msg m;
    memset(&m, 0, sizeof(m));
    m.type = RLAI_MSG_CALL;
    m.u.call.command = (char *)command;
    m.u.call.params_json = (char *)params;
    return round_trip(endpoint, &m, call_frame, &o);
}

/* ---------------------------------------------------------- plugins */

typedef struct plugins_out {
    cJSON *reg;
} plugins_out;

static void plugins_frame(void *user, const rlai_msg *f)
{
    plugins_out *o = user;
    if (f->type == RLAI_MSG_RESULT && !o->reg)
        o->reg = result_json(f);
}

static void print_params(const cJSON *schema)
{
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(schema, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(schema, "required");
    if (!cJSON_IsObject(props) || !props->child) {
        printf("      params: none\n");
        return;
    }
    printf("      params:");
    for (const cJSON *p = props->child; p; p = p->next) {
        bool required = false;
        const cJSON *r;
        cJSON_ArrayForEach(r, req)
            required |= cJSON_IsString(r) && !strcmp(r->valuestring, p->string);
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "type");
        printf(" %s%s%s%s%s", p->string, cJSON_IsString(t) ? ":" : "", cJSON_IsString(t) ? t->valuestring : "",
               required ? " (required)" : "", p->next ? "," : "");
    }
    printf("\n");
}

int rlai_cli_plugins_main(int argc, char **argv)
{
    const char *endpoint = NULL;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--endpoint") && i + 1 < argc)
            endpoint = argv[++i];
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: rlai plugins [--endpoint E] [--json]\n"
                   "list the running engine's plugins and their commands\n");
            return 0;
        } else if (!strcmp(argv[i], "--json"))
            json = true;
        else {
            fprintf(stderr, "usage: rlai plugins [--endpoint E] [--json]\n");
            return 2;
        }
    }
    rlai_msg m;
    memset(&m, 0, sizeof(m));
    m.type = RLAI_MSG_COMMANDS;
    plugins_out o = { 0 };
    int rc = round_trip(endpoint, &m, plugins_frame, &o);
    if (rc != 0 || !o.reg) {
        cJSON_Delete(o.reg);
        return rc ? rc : 1;
    }
    if (json) {
        char *txt = cJSON_Print(o.reg);
        printf("%s\n", txt ? txt : "{}");
        free(txt);
        cJSON_Delete(o.reg);
        return 0;
    }
    const cJSON *plugins = cJSON_GetObjectItemCaseSensitive(o.reg, "plugins");
    const cJSON *cmds = cJSON_GetObjectItemCaseSensitive(o.reg, "commands");
    if (cJSON_GetArraySize(plugins) == 0)
        printf("no plugins loaded (rlai serve --plugins DIR)\n");
    const cJSON *p;
    cJSON_ArrayForEach(p, plugins) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(p, "name");
        const cJSON *ver = cJSON_GetObjectItemCaseSensitive(p, "version");
        const cJSON *desc = cJSON_GetObjectItemCaseSensitive(p, "description");
        printf("%s %s - %s\n", cJSON_IsString(name) ? name->valuestring : "?",
               cJSON_IsString(ver) ? ver->valuestring : "?", cJSON_IsString(desc) ? desc->valuestring : "");
        const cJSON *c;
        cJSON_ArrayForEach(c, cmds) {
            const cJSON *pl = cJSON_GetObjectItemCaseSensitive(c, "plugin");
            if (!cJSON_IsString(pl) || !cJSON_IsString(name) || strcmp(pl->valuestring, name->valuestring))
                continue;
            const cJSON *cn = cJSON_GetObjectItemCaseSensitive(c, "name");
            const cJSON *cd = cJSON_GetObjectItemCaseSensitive(c, "description");
            const cJSON *st = cJSON_GetObjectItemCaseSensitive(c, "streams");
            printf("  %s%s\n      %s\n", cJSON_IsString(cn) ? cn->valuestring : "?",
                   cJSON_IsTrue(st) ? "  [streams]" : "", cJSON_IsString(cd) ? cd->valuestring : "");
            print_params(cJSON_GetObjectItemCaseSensitive(c, "parameters"));
        }
    }
    cJSON_Delete(o.reg);
    return 0;
}
