/* gassist_manifest.c - command names as G-Assist functions, and
 * manifest.json from the engine's registry. */
#include "gassist_manifest.h"

#include "gassist_msgpack.h"

#include <stdlib.h>
#include <string.h>

int rlai_gassist_function_name(const char *command, char *buf, size_t cap)
{
    if (!command || !command[0])
        return RLAI_ERR_INVALID_ARG;
    size_t n = strlen(command);
    if (n > RLAI_GASSIST_MAX_FUNCTION || n + 1 > cap)
        return RLAI_ERR_TOO_LARGE;
    for (size_t i = 0; i < n; i++) {
        char c = command[i];
        if (c >= 'A' && c <= 'Z')
            c = (char)(c - 'A' + 'a');
        else if (c == '.' || c == '-')
            c = '_';
        else if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'))
            return RLAI_ERR_INVALID_ARG;
        buf[i] = c;
    }
    buf[n] = 0;
    if (!strncmp(buf, "rise_", 5))
        return RLAI_ERR_INVALID_ARG;
    return 0;
}

static void set_err(char *err, size_t errlen, const char *fmt, const char *a, const char *b)
{
    if (err && errlen)
        snprintf(err, errlen, fmt, a ? a : "", b ? b : "");
}

int rlai_gassist_fetch_registry(rlai_client *c, int timeout_ms, cJSON **out, char *err, size_t errlen)
{
    *out = NULL;
    if (timeout_ms <= 0)
        timeout_ms = 3000;
    rlai_msg m;
    memset(&m, 0, sizeof(m));
    m.version = RLAI_PROTO_VERSION;
    m.type = RLAI_MSG_COMMANDS;
    m.id = rlai_client_next_id(c);
    int rc = rlai_client_send(c, &m);
    if (rc < 0) {
        set_err(err, errlen, "cannot ask the engine for its commands: %s%s", rlai_strerror(rc), NULL);
        return rc;
    }
    cJSON *reg = NULL;
    for (;;) {
        rlai_msg f;
        rc = rlai_client_recv(c, timeout_ms, &f);
        if (rc < 0) {
            set_err(err, errlen, "no command list from the engine: %s%s", rlai_strerror(rc), NULL);
            break;
        }
        if (f.id != m.id) {
            rlai_msg_free(&f);
            continue;
        }
        if (f.type == RLAI_MSG_RESULT && !reg) {
            char merr[128];
            rc = gassist_msgpack_to_json(f.u.result.data, f.u.result.len, &reg, merr, sizeof(merr));
            if (rc < 0)
                set_err(err, errlen, "the engine's command list does not decode: %s%s", merr, NULL);
        } else if (f.type == RLAI_MSG_ERROR) {
            set_err(err, errlen, "the engine refused the command list: %s", f.u.error.msg, NULL);
            rc = RLAI_ERR_PROTOCOL;
        }
        bool end = f.type == RLAI_MSG_DONE || f.type == RLAI_MSG_ERROR;
        rlai_msg_free(&f);
        if (end || rc < 0)
            break;
    }
    if (rc >= 0 && !cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(reg, "commands"))) {
        set_err(err, errlen, "the engine's command list has no \"commands\" array%s%s", NULL, NULL);
        rc = RLAI_ERR_PROTOCOL;
    }
    if (rc < 0) {
        cJSON_Delete(reg);
        return rc;
    }
    *out = reg;
    return 0;
}

static const char *entry_name(const cJSON *e)
{
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(e, "name");
    return cJSON_IsString(n) ? n->valuestring : NULL;
}

const cJSON *rlai_gassist_registry_find(const cJSON *registry, const char *function)
{
    const cJSON *cmds = cJSON_GetObjectItemCaseSensitive(registry, "commands");
    const cJSON *e;
    char fn[RLAI_GASSIST_MAX_FUNCTION + 1];
    cJSON_ArrayForEach(e, cmds) {
        const char *name = entry_name(e);
        if (!name)
            continue;
        if (!strcmp(name, function))
            return e;
        if (rlai_gassist_function_name(name, fn, sizeof(fn)) == 0 && !strcmp(fn, function))
            return e;
    }
    return NULL;
}

static bool ident_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.' || c == '-';
}

/* Copy of text in which every command name of the registry that stands as
 * a word ("see loremaster.characters") is replaced by its G-Assist
 * function name, so descriptions name what G-Assist can call. Caller
 * frees; NULL when out of memory. */
static char *rename_commands(const char *text, const cJSON *registry)
{
    size_t len = 0;
    char *out = malloc(strlen(text) + 1);
    if (!out)
        return NULL;
    const char *p = text;
    while (*p) {
        const char *hit = NULL;
        size_t hit_len = 0;
        char fn[RLAI_GASSIST_MAX_FUNCTION + 1];
        if (p == text || !ident_char(p[-1])) {
            const cJSON *e;
            cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(registry, "commands")) {
                const char *name = entry_name(e);
                size_t n = name ? strlen(name) : 0;
                /* a trailing '.' ends a sentence, not the name */
                if (n > hit_len && !strncmp(p, name, n) &&
                    (!ident_char(p[n]) || (p[n] == '.' && !ident_char(p[n + 1]))) &&
                    rlai_gassist_function_name(name, fn, sizeof(fn)) == 0) {
                    hit = name;
                    hit_len = n;
                }
            }
        }
        if (hit) {
            /* function names are exactly as long as their command names */
            rlai_gassist_function_name(hit, fn, sizeof(fn));
            memcpy(out + len, fn, hit_len);
            len += hit_len;
            p += hit_len;
        } else {
            out[len++] = *p++;
        }
    }
    out[len] = 0;
    return out;
}

/* Replaces the string value of obj[key] by rename_commands() of it. */
static void rename_in(cJSON *obj, const char *key, const cJSON *registry)
{
    cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsString(v))
        return;
    char *r = rename_commands(v->valuestring, registry);
    if (r && strcmp(r, v->valuestring)) {
        cJSON *n = cJSON_CreateString(r);
        if (n)
            cJSON_ReplaceItemInObjectCaseSensitive(obj, key, n);
    }
    free(r);
}

/* Copies the keys of a property schema that G-Assist understands. */
static cJSON *property(const cJSON *src)
{
    static const char *const keep[] = { "type", "description", "enum", "default",
                                        "minimum", "maximum", "items" };
    cJSON *p = cJSON_CreateObject();
    if (!p)
        return NULL;
    for (size_t i = 0; i < sizeof(keep) / sizeof(keep[0]); i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(src, keep[i]);
        if (!v)
            continue;
        cJSON *c = cJSON_Duplicate(v, 1);
        if (!c || !cJSON_AddItemToObject(p, keep[i], c)) {
            cJSON_Delete(c);
            cJSON_Delete(p);
            return NULL;
        }
    }
    if (!cJSON_GetObjectItemCaseSensitive(p, "type") && !cJSON_AddStringToObject(p, "type", "string")) {
        cJSON_Delete(p);
        return NULL;
    }
    return p;
}

/* properties + required of a command's schema, without bridge-managed
 * parameters. */
static int parameters(const cJSON *schema, cJSON **props_out, cJSON **req_out)
{
    cJSON *props = cJSON_CreateObject(), *req = cJSON_CreateArray();
    if (!props || !req)
        goto fail;
    const cJSON *p;
    cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(schema, "properties")) {
        if (!p->string || !strcmp(p->string, RLAI_GASSIST_SESSION_PARAM))
            continue;
        cJSON *c = property(p);
        if (!c || !cJSON_AddItemToObject(props, p->string, c)) {
            cJSON_Delete(c);
            goto fail;
        }
    }
    cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(schema, "required")) {
        if (!cJSON_IsString(p) || !strcmp(p->valuestring, RLAI_GASSIST_SESSION_PARAM))
            continue;
        cJSON *s = cJSON_CreateString(p->valuestring);
        if (!s || !cJSON_AddItemToArray(req, s)) {
            cJSON_Delete(s);
            goto fail;
        }
    }
    *props_out = props;
    *req_out = req;
    return 0;
fail:
    cJSON_Delete(props);
    cJSON_Delete(req);
    return RLAI_ERR_NOMEM;
}

/* One functions[] entry. Parameters are written in both styles found in
 * shipped manifests: properties/required on the function (the examples)
 * and nested "parameters" (MCP-generated manifests, the emulator). */
static cJSON *function(const cJSON *e, const char *fname)
{
    const cJSON *desc = cJSON_GetObjectItemCaseSensitive(e, "description");
    const cJSON *plugin = cJSON_GetObjectItemCaseSensitive(e, "plugin");
    cJSON *f = cJSON_CreateObject();
    cJSON *props = NULL, *req = NULL, *params = NULL, *tags = NULL;
    if (!f || !cJSON_AddStringToObject(f, "name", fname))
        goto fail;
    char fallback[320];
    snprintf(fallback, sizeof(fallback), "Runs the RTX-LocalAI command %s on the local engine.",
             entry_name(e));
    if (!cJSON_AddStringToObject(f, "description",
                                 cJSON_IsString(desc) && desc->valuestring[0] ? desc->valuestring : fallback))
        goto fail;
    tags = cJSON_CreateArray();
    if (!tags)
        goto fail;
    if (cJSON_IsString(plugin) && plugin->valuestring[0])
        cJSON_AddItemToArray(tags, cJSON_CreateString(plugin->valuestring));
    cJSON_AddItemToArray(tags, cJSON_CreateString("rtx-localai"));
    cJSON_AddItemToArray(tags, cJSON_CreateString("local"));
    if (!cJSON_AddItemToObject(f, "tags", tags)) {
        cJSON_Delete(tags);
        goto fail;
    }
    if (parameters(cJSON_GetObjectItemCaseSensitive(e, "parameters"), &props, &req) < 0)
        goto fail;
    params = cJSON_CreateObject();
    cJSON *pc = cJSON_Duplicate(props, 1), *rc = cJSON_Duplicate(req, 1);
    if (!params || !pc || !rc || !cJSON_AddStringToObject(params, "type", "object") ||
        !cJSON_AddItemToObject(params, "properties", pc)) {
        cJSON_Delete(pc);
        cJSON_Delete(rc);
        goto fail;
    }
    if (!cJSON_AddItemToObject(params, "required", rc)) {
        cJSON_Delete(rc);
        goto fail;
    }
    if (!cJSON_AddItemToObject(f, "properties", props))
        goto fail;
    props = NULL;
    if (!cJSON_AddItemToObject(f, "required", req))
        goto fail;
    req = NULL;
    if (!cJSON_AddItemToObject(f, "parameters", params))
        goto fail;
    return f;
fail:
    cJSON_Delete(props);
    cJSON_Delete(req);
    cJSON_Delete(params);
    cJSON_Delete(f);
    return NULL;
}

cJSON *rlai_gassist_manifest_build(const cJSON *registry, const rlai_gassist_manifest_opts *o,
                                   char *err, size_t errlen)
{
    rlai_gassist_manifest_opts d = { 0 };
    if (!o)
        o = &d;
    const cJSON *cmds = cJSON_GetObjectItemCaseSensitive(registry, "commands");
    cJSON *m = cJSON_CreateObject();
    cJSON *fns = cJSON_CreateArray();
    if (!m || !fns) {
        cJSON_Delete(m);
        cJSON_Delete(fns);
        set_err(err, errlen, "out of memory%s%s", NULL, NULL);
        return NULL;
    }
    cJSON_AddNumberToObject(m, "manifestVersion", 1);
    cJSON_AddStringToObject(m, "name", o->name ? o->name : RLAI_GASSIST_DEFAULT_NAME);
    cJSON_AddStringToObject(m, "version", RLAI_GASSIST_VERSION);
    cJSON_AddStringToObject(m, "description",
                            o->description ? o->description
                                           : "Local AI on your RTX PC (RTX-LocalAI): the commands of the "
                                             "plugins loaded in the local engine, run without the cloud.");
    cJSON_AddStringToObject(m, "executable", o->executable ? o->executable : RLAI_GASSIST_DEFAULT_EXECUTABLE);
    cJSON_AddBoolToObject(m, "persistent", 1);
    cJSON_AddStringToObject(m, "protocol_version", "2.0");
    cJSON_AddItemToObject(m, "functions", fns);
    const cJSON *e;
    char fname[RLAI_GASSIST_MAX_FUNCTION + 1];
    cJSON_ArrayForEach(e, cmds) {
        const char *name = entry_name(e);
        int rc = name ? rlai_gassist_function_name(name, fname, sizeof(fname)) : RLAI_ERR_INVALID_ARG;
        if (rc < 0) {
            fprintf(stderr, "rlai gassist: skipping command '%s': no valid G-Assist function name (%s)\n",
                    name ? name : "?", rlai_strerror(rc));
            continue;
        }
        const cJSON *prev;
        cJSON_ArrayForEach(prev, fns) {
            if (!strcmp(entry_name(prev), fname)) {
                set_err(err, errlen, "two engine commands map to the G-Assist function name '%s' (%s)", fname,
                        name);
                cJSON_Delete(m);
                return NULL;
            }
        }
        cJSON *f = function(e, fname);
        if (f) {
            rename_in(f, "description", registry);
            cJSON *pr;
            cJSON_ArrayForEach(pr, cJSON_GetObjectItemCaseSensitive(f, "properties"))
                rename_in(pr, "description", registry);
            cJSON_ArrayForEach(pr, cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(f, "parameters"),
                                                                   "properties"))
                rename_in(pr, "description", registry);
        }
        if (!f || !cJSON_AddItemToArray(fns, f)) {
            cJSON_Delete(f);
            cJSON_Delete(m);
            set_err(err, errlen, "out of memory%s%s", NULL, NULL);
            return NULL;
        }
    }
    if (cJSON_GetArraySize(fns) == 0) {
        set_err(err, errlen,
                "the engine has no commands to offer G-Assist (is `rlai serve` running with its plugins? "
                "see `rlai plugins`)%s%s", NULL, NULL);
        cJSON_Delete(m);
        return NULL;
    }
    return m;
}

static const char *resolve_endpoint(const char *endpoint)
{
    if (endpoint && *endpoint)
        return endpoint;
    const char *env = getenv("RLAI_ENDPOINT");
    return env && *env ? env : NULL;
}

static cJSON *fetch_manifest(const rlai_gassist_manifest_opts *o, int *rc_out, char *err, size_t errlen)
{
    rlai_client *c = NULL;
    char cerr[512];
    int timeout = o->timeout_ms > 0 ? o->timeout_ms : 3000;
    int rc = rlai_client_connect(resolve_endpoint(o->endpoint), timeout, &c, cerr, sizeof(cerr));
    if (rc < 0) {
        if (err && errlen)
            snprintf(err, errlen, "%s", cerr);
        *rc_out = rc;
        return NULL;
    }
    cJSON *reg = NULL;
    rc = rlai_gassist_fetch_registry(c, timeout, &reg, err, errlen);
    rlai_client_close(c);
    if (rc < 0) {
        *rc_out = rc;
        return NULL;
    }
    cJSON *m = rlai_gassist_manifest_build(reg, o, err, errlen);
    cJSON_Delete(reg);
    *rc_out = m ? 0 : RLAI_ERR_NOT_FOUND;
    return m;
}

static int emit(const cJSON *m, FILE *out)
{
    char *s = cJSON_Print(m);
    if (!s)
        return RLAI_ERR_NOMEM;
    int ok = fputs(s, out) >= 0 && fputc('\n', out) != EOF && fflush(out) == 0;
    free(s);
    return ok ? 0 : RLAI_ERR_IO;
}

int rlai_gassist_manifest_save(const rlai_gassist_manifest_opts *o, const char *path, char *err,
                               size_t errlen)
{
    rlai_gassist_manifest_opts d = { 0 };
    int rc = 0;
    cJSON *m = fetch_manifest(o ? o : &d, &rc, err, errlen);
    if (!m)
        return rc;
    if (!path || !strcmp(path, "-")) {
        rc = emit(m, stdout);
        if (rc < 0)
            set_err(err, errlen, "cannot write the manifest to stdout%s%s", NULL, NULL);
        cJSON_Delete(m);
        return rc;
    }
    size_t n = strlen(path);
    char *tmp = malloc(n + 5);
    if (!tmp) {
        cJSON_Delete(m);
        return RLAI_ERR_NOMEM;
    }
    memcpy(tmp, path, n);
    memcpy(tmp + n, ".tmp", 5);
    FILE *f = fopen(tmp, "w");
    rc = f ? emit(m, f) : RLAI_ERR_IO;
    if (f && fclose(f) != 0)
        rc = RLAI_ERR_IO;
    if (rc == 0 && rename(tmp, path) != 0)
        rc = RLAI_ERR_IO;
    if (rc < 0) {
        set_err(err, errlen, "cannot write %s: %s", path, rlai_strerror(rc));
        remove(tmp);
    }
    free(tmp);
    cJSON_Delete(m);
    return rc;
}

int rlai_gassist_manifest(const char *endpoint, FILE *out, char *err, size_t errlen)
{
    rlai_gassist_manifest_opts o = { 0 };
    o.endpoint = endpoint;
    int rc = 0;
    cJSON *m = fetch_manifest(&o, &rc, err, errlen);
    if (!m)
        return rc;
    rc = emit(m, out);
    if (rc < 0)
        set_err(err, errlen, "cannot write the manifest: %s%s", rlai_strerror(rc), NULL);
    cJSON_Delete(m);
    return rc;
}

static void manifest_usage(FILE *f)
{
    fprintf(f,
        "usage: rlai gassist manifest [--endpoint E] [-o FILE] [--name NAME] [--executable FILE]\n"
        "  writes the G-Assist plugin manifest.json from the running engine's commands\n"
        "  --endpoint E       engine endpoint (default $RLAI_ENDPOINT, else the private socket of `rlai serve`)\n"
        "  -o, --output FILE  where to write (default stdout; FILE is replaced atomically)\n"
        "  --name NAME        plugin name = its folder under G-Assist's plugins folder (default \"rlai\")\n"
        "  --executable FILE  the bridge's file name (default \"" RLAI_GASSIST_DEFAULT_EXECUTABLE "\")\n");
}

int rlai_gassist_manifest_main(int argc, char **argv)
{
    if (argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        manifest_usage(stdout);
        return 0;
    }
    if (argc < 2 || strcmp(argv[1], "manifest")) {
        manifest_usage(stderr);
        return 2;
    }
    rlai_gassist_manifest_opts o = { 0 };
    const char *path = NULL;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        bool has = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            manifest_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--endpoint") && has) {
            o.endpoint = argv[++i];
        } else if ((!strcmp(a, "-o") || !strcmp(a, "--output")) && has) {
            path = argv[++i];
        } else if (!strcmp(a, "--name") && has) {
            o.name = argv[++i];
        } else if (!strcmp(a, "--executable") && has) {
            o.executable = argv[++i];
        } else {
            fprintf(stderr, "rlai gassist: unexpected argument '%s'\n", a);
            manifest_usage(stderr);
            return 2;
        }
    }
    char err[1024];
    if (rlai_gassist_manifest_save(&o, path, err, sizeof(err)) < 0) {
        fprintf(stderr, "rlai gassist: %s\n", err);
        return 1;
    }
    if (path && strcmp(path, "-"))
        fprintf(stderr, "rlai gassist: wrote %s\n", path);
    return 0;
}
