/* tools.c - response_format and function calling (tools.h). */
#include "tools.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failf(char *err, size_t errlen, int rc, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}

static int schema_grammar(const cJSON *schema, unsigned flags, rlai_grammar **out, const char *what, char *err,
                          size_t errlen)
{
    char *text = cJSON_PrintUnformatted(schema);
    if (!text)
        return failf(err, errlen, RLAI_ERR_NOMEM, "out of memory");
    char msg[256] = "";
    int rc = rlai_grammar_from_json_schema_flags(text, strlen(text), flags, out, msg, sizeof(msg));
    free(text);
    if (rc < 0)
        return failf(err, errlen, rc, "%s: %s", what, msg[0] ? msg : rlai_strerror(rc));
    return 0;
}

int rlai_response_format_grammar(const cJSON *rf, rlai_grammar **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!rf || cJSON_IsNull(rf))
        return 0;
    if (!cJSON_IsObject(rf))
        return failf(err, errlen, RLAI_ERR_INVALID_ARG, "'response_format' must be an object");
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(rf, "type");
    if (!cJSON_IsString(t))
        return failf(err, errlen, RLAI_ERR_INVALID_ARG,
                     "'response_format' needs a 'type': \"text\", \"json_object\" or \"json_schema\"");
    if (!strcmp(t->valuestring, "text"))
        return 0;
    if (!strcmp(t->valuestring, "json_object")) {
        int rc = rlai_grammar_json_object(out);
        return rc < 0 ? failf(err, errlen, rc, "out of memory") : 0;
    }
    if (!strcmp(t->valuestring, "json_schema")) {
        const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
        if (!cJSON_IsObject(js))
            return failf(err, errlen, RLAI_ERR_INVALID_ARG,
                         "response_format json_schema needs a 'json_schema' object {\"name\", \"schema\", \"strict\"}");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(js, "name");
        if (name && !cJSON_IsString(name))
            return failf(err, errlen, RLAI_ERR_INVALID_ARG, "response_format.json_schema.name must be a string");
        const cJSON *strict = cJSON_GetObjectItemCaseSensitive(js, "strict");
        if (strict && !cJSON_IsBool(strict) && !cJSON_IsNull(strict))
            return failf(err, errlen, RLAI_ERR_INVALID_ARG, "response_format.json_schema.strict must be a boolean");
        const cJSON *schema = cJSON_GetObjectItemCaseSensitive(js, "schema");
        if (!schema || cJSON_IsNull(schema)) {
            /* OpenAI: no schema means any JSON object */
            int rc = rlai_grammar_json_object(out);
            return rc < 0 ? failf(err, errlen, rc, "out of memory") : 0;
        }
        if (!cJSON_IsObject(schema) && !cJSON_IsBool(schema))
            return failf(err, errlen, RLAI_ERR_INVALID_ARG, "response_format.json_schema.schema must be a JSON Schema object");
        return schema_grammar(schema, 0, out, "response_format.json_schema.schema", err, errlen);
    }
    return failf(err, errlen, RLAI_ERR_INVALID_ARG,
                 "response_format type '%.40s' is not supported (text, json_object, json_schema)", t->valuestring);
}

void rlai_tools_free(rlai_tools *t)
{
    if (!t)
        return;
    cJSON_Delete(t->names);
    free(t->system);
    rlai_grammar_unref(t->grammar);
    memset(t, 0, sizeof(*t));
}

/* The call object of one function: {"name": const, "arguments": params}. */
static cJSON *call_schema(const char *name, const cJSON *params)
{
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "type", "object");
    cJSON *props = cJSON_AddObjectToObject(s, "properties");
    cJSON *n = cJSON_AddObjectToObject(props, "name");
    cJSON_AddStringToObject(n, "const", name);
    if (params && !(cJSON_IsObject(params) && !params->child))
        cJSON_AddItemToObject(props, "arguments", cJSON_Duplicate(params, true));
    else
        cJSON_AddStringToObject(cJSON_AddObjectToObject(props, "arguments"), "type", "object");
    cJSON *req = cJSON_AddArrayToObject(s, "required");
    cJSON_AddItemToArray(req, cJSON_CreateString("name"));
    cJSON_AddItemToArray(req, cJSON_CreateString("arguments"));
    cJSON_AddFalseToObject(s, "additionalProperties");
    return s;
}

static int sys_add(char **buf, size_t *len, size_t *cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return RLAI_ERR_INVALID_ARG;
    if (*len + (size_t)n + 1 > *cap) {
        size_t nc = (*cap + (size_t)n + 1) * 2;
        char *nb = realloc(*buf, nc);
        if (!nb)
            return RLAI_ERR_NOMEM;
        *buf = nb;
        *cap = nc;
    }
    va_start(ap, fmt);
    vsnprintf(*buf + *len, *cap - *len, fmt, ap);
    va_end(ap);
    *len += (size_t)n;
    return 0;
}

int rlai_tools_parse(const cJSON *body, rlai_tools *t, char *err, size_t errlen, const char **param)
{
    memset(t, 0, sizeof(*t));
    *param = "tools";
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(body, "tools");
    const cJSON *choice = cJSON_GetObjectItemCaseSensitive(body, "tool_choice");
    const cJSON *fns = cJSON_GetObjectItemCaseSensitive(body, "functions");
    if (fns && !cJSON_IsNull(fns)) {
        *param = "functions";
        return failf(err, errlen, RLAI_ERR_UNSUPPORTED, "'functions' (the deprecated form) is not supported: use 'tools'");
    }
    if (!tools || cJSON_IsNull(tools) || (cJSON_IsArray(tools) && !tools->child)) {
        if (choice && !cJSON_IsNull(choice) && !(cJSON_IsString(choice) && !strcmp(choice->valuestring, "none"))) {
            *param = "tool_choice";
            return failf(err, errlen, RLAI_ERR_INVALID_ARG, "'tool_choice' is set but no 'tools' are given");
        }
        return 0;
    }
    if (!cJSON_IsArray(tools))
        return failf(err, errlen, RLAI_ERR_INVALID_ARG, "'tools' must be an array of {\"type\": \"function\", ...}");
    /* each tool is an alternative of the call grammar, which follows at
     * most 128 at once (docs/STRUCTURED.md, "Open alternatives") */
    if (cJSON_GetArraySize(tools) > RLAI_TOOLS_MAX)
        return failf(err, errlen, RLAI_ERR_TOO_LARGE, "at most %d tools are supported, %d were given", RLAI_TOOLS_MAX,
                     cJSON_GetArraySize(tools));
    rlai_tool_mode mode = RLAI_TOOLS_AUTO;
    const char *named = NULL;
    if (choice && !cJSON_IsNull(choice)) {
        *param = "tool_choice";
        if (cJSON_IsString(choice)) {
            if (!strcmp(choice->valuestring, "none"))
                return 0;
            if (!strcmp(choice->valuestring, "auto"))
                mode = RLAI_TOOLS_AUTO;
            else if (!strcmp(choice->valuestring, "required"))
                mode = RLAI_TOOLS_REQUIRED;
            else
                return failf(err, errlen, RLAI_ERR_INVALID_ARG,
                             "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                             "\"function\": {\"name\": ...}}");
        } else {
            const cJSON *ty = cJSON_GetObjectItemCaseSensitive(choice, "type");
            const cJSON *fn = cJSON_GetObjectItemCaseSensitive(choice, "function");
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
            if (!cJSON_IsObject(choice) || !cJSON_IsString(ty) || strcmp(ty->valuestring, "function") ||
                !cJSON_IsString(nm))
                return failf(err, errlen, RLAI_ERR_INVALID_ARG,
                             "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                             "\"function\": {\"name\": ...}}");
            mode = RLAI_TOOLS_NAMED;
            named = nm->valuestring;
        }
    }
    *param = "tools";
    cJSON *any = cJSON_CreateObject();
    cJSON *alts = cJSON_AddArrayToObject(any, "anyOf");
    t->names = cJSON_CreateArray();
    char *sys = NULL;
    size_t len = 0, cap = 0;
    int rc = any && alts && t->names ? 0 : RLAI_ERR_NOMEM;
    rc = rc ? rc : sys_add(&sys, &len, &cap, "You can call the following functions (tools):\n");
    int i = 0, found = 0;
    const cJSON *tool;
    cJSON_ArrayForEach(tool, tools) {
        if (rc)
            break;
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(tool, "type");
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tool, "function");
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *desc = cJSON_GetObjectItemCaseSensitive(fn, "description");
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        if (!cJSON_IsObject(tool) || !cJSON_IsString(ty) || strcmp(ty->valuestring, "function") || !cJSON_IsObject(fn) ||
            !cJSON_IsString(nm) || !nm->valuestring[0] || strlen(nm->valuestring) > 64) {
            rc = failf(err, errlen, RLAI_ERR_INVALID_ARG,
                       "tools[%d] must be {\"type\": \"function\", \"function\": {\"name\": \"...\" (1-64 chars), "
                       "\"description\", \"parameters\"}}", i);
            break;
        }
        for (const cJSON *x = t->names->child; x; x = x->next)
            if (!strcmp(x->valuestring, nm->valuestring)) {
                rc = failf(err, errlen, RLAI_ERR_INVALID_ARG, "tools[%d]: the function name '%s' is used twice", i,
                           nm->valuestring);
                break;
            }
        if (rc)
            break;
        if (params && !cJSON_IsNull(params) && !cJSON_IsObject(params)) {
            rc = failf(err, errlen, RLAI_ERR_INVALID_ARG, "tools[%d].function.parameters must be a JSON Schema object", i);
            break;
        }
        if (cJSON_IsNull(params))
            params = NULL;
        cJSON_AddItemToArray(t->names, cJSON_CreateString(nm->valuestring));
        /* each parameters schema is checked on its own, for a message naming the tool */
        char what[64];
        snprintf(what, sizeof(what), "tools[%d].function.parameters", i);
        cJSON *cs = call_schema(nm->valuestring, params);
        rlai_grammar *probe = NULL;
        rc = cs ? schema_grammar(cs, 0, &probe, what, err, errlen) : RLAI_ERR_NOMEM;
        rlai_grammar_unref(probe);
        if (rc) {
            cJSON_Delete(cs);
            break;
        }
        if (!named || !strcmp(named, nm->valuestring)) {
            cJSON_AddItemToArray(alts, cs);
            found++;
        } else {
            cJSON_Delete(cs);
        }
        char *ps = params ? cJSON_PrintUnformatted(params) : strdup("{\"type\":\"object\"}");
        rc = sys_add(&sys, &len, &cap, "- %s: %s\n  parameters (JSON Schema): %s\n", nm->valuestring,
                     cJSON_IsString(desc) ? desc->valuestring : "(no description)", ps ? ps : "{}");
        free(ps);
        i++;
    }
    if (!rc && named && !found) {
        *param = "tool_choice";
        rc = failf(err, errlen, RLAI_ERR_INVALID_ARG, "tool_choice names the function '%s', which is not in 'tools'", named);
    }
    if (!rc && mode == RLAI_TOOLS_AUTO)
        rc = sys_add(&sys, &len, &cap, "To call a function, reply with only a JSON object {\"name\": \"<function name>\", "
                                       "\"arguments\": {<arguments>}}. If no function is needed, reply in plain text.");
    else if (!rc && named)
        rc = sys_add(&sys, &len, &cap, "Reply with only a JSON object {\"name\": \"%s\", \"arguments\": "
                                       "{<arguments>}} that calls this function.", named);
    else if (!rc)
        rc = sys_add(&sys, &len, &cap, "Reply with only a JSON object {\"name\": \"<function name>\", \"arguments\": "
                                       "{<arguments>}} that calls one of these functions.");
    if (!rc)
        rc = schema_grammar(any, mode == RLAI_TOOLS_AUTO ? RLAI_GRAMMAR_OR_TEXT : 0, &t->grammar, "tools", err, errlen);
    cJSON_Delete(any);
    t->system = sys;
    if (rc) {
        rlai_tools_free(t);
        return rc;
    }
    t->mode = mode;
    return 0;
}

static const char *call_name_for(const cJSON *msgs, const char *id)
{
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        const cJSON *c;
        cJSON_ArrayForEach(c, calls) {
            const cJSON *cid = cJSON_GetObjectItemCaseSensitive(c, "id");
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c, "function"), "name");
            if (cJSON_IsString(cid) && cJSON_IsString(nm) && !strcmp(cid->valuestring, id))
                return nm->valuestring;
        }
    }
    return NULL;
}

char *rlai_tools_message_text(const cJSON *msgs, const cJSON *msg, const char *role, const char *content,
                              const char **role_out)
{
    *role_out = role;
    char *buf = NULL;
    size_t len = 0, cap = 0;
    if (!strcmp(role, "tool")) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(msg, "tool_call_id");
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(msg, "name");
        const char *ids = cJSON_IsString(id) ? id->valuestring : "";
        const char *name = cJSON_IsString(nm) ? nm->valuestring : call_name_for(msgs, ids);
        *role_out = "user";
        if (sys_add(&buf, &len, &cap, "Result of the function call %s%s%s%s: %s", name ? name : "", ids[0] ? " (" : "",
                    ids, ids[0] ? ")" : "", content) < 0) {
            free(buf);
            return NULL;
        }
        return buf;
    }
    if (sys_add(&buf, &len, &cap, "%s", content) < 0) {
        free(buf);
        return NULL;
    }
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(msg, "tool_calls");
    const cJSON *c;
    cJSON_ArrayForEach(c, calls) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", cJSON_IsString(nm) ? nm->valuestring : "");
        cJSON *a = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : NULL;
        cJSON_AddItemToObject(o, "arguments", a ? a : cJSON_CreateObject());
        char *txt = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        int rc = txt ? sys_add(&buf, &len, &cap, "%s%s", len ? "\n" : "", txt) : RLAI_ERR_NOMEM;
        free(txt);
        if (rc < 0) {
            free(buf);
            return NULL;
        }
    }
    return buf;
}

cJSON *rlai_tools_extract(const rlai_tools *t, const char *text, uint64_t salt)
{
    if (!t || t->mode == RLAI_TOOLS_OFF || !text)
        return NULL;
    while (*text == ' ' || *text == '\n' || *text == '\t' || *text == '\r')
        text++;
    if (*text != '{')
        return NULL;
    cJSON *o = cJSON_Parse(text);
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(o, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(o, "arguments");
    bool known = false;
    for (const cJSON *x = t->names ? t->names->child : NULL; x && cJSON_IsString(nm); x = x->next)
        known |= !strcmp(x->valuestring, nm->valuestring);
    if (!cJSON_IsObject(o) || !known || !cJSON_IsObject(args)) {
        cJSON_Delete(o);
        return NULL;
    }
    char *at = cJSON_PrintUnformatted(args);
    cJSON *calls = cJSON_CreateArray();
    cJSON *c = cJSON_CreateObject();
    char id[40];
    snprintf(id, sizeof(id), "call_%016llx", (unsigned long long)(salt * 0x9E3779B97F4A7C15ull ^ 0x5851F42D4C957F2Dull));
    cJSON_AddStringToObject(c, "id", id);
    cJSON_AddStringToObject(c, "type", "function");
    cJSON *f = cJSON_AddObjectToObject(c, "function");
    cJSON_AddStringToObject(f, "name", nm->valuestring);
    cJSON_AddStringToObject(f, "arguments", at ? at : "{}");
    cJSON_AddItemToArray(calls, c);
    free(at);
    cJSON_Delete(o);
    return calls;
}

/* Appends s to the string member key of o (created when missing). */
static int append_member(cJSON *o, const char *key, const char *s)
{
    cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    const char *old = cJSON_IsString(v) ? v->valuestring : "";
    size_t a = strlen(old), b = strlen(s);
    char *n = malloc(a + b + 1);
    if (!n)
        return RLAI_ERR_NOMEM;
    memcpy(n, old, a);
    memcpy(n + a, s, b + 1);
    cJSON *nv = cJSON_CreateString(n);
    free(n);
    if (!nv)
        return RLAI_ERR_NOMEM;
    if (v)
        cJSON_ReplaceItemInObjectCaseSensitive(o, key, nv);
    else
        cJSON_AddItemToObject(o, key, nv);
    return 0;
}

int rlai_tool_calls_merge(cJSON *calls, const cJSON *deltas)
{
    for (const cJSON *d = cJSON_IsArray(deltas) ? deltas->child : NULL; d; d = d->next) {
        const cJSON *ix = cJSON_GetObjectItemCaseSensitive(d, "index");
        int index = cJSON_IsNumber(ix) ? (int)ix->valuedouble : 0;
        cJSON *c = NULL;
        for (cJSON *x = calls->child; x && !c; x = x->next)
            if ((int)cJSON_GetObjectItemCaseSensitive(x, "index")->valuedouble == index)
                c = x;
        if (!c) {
            c = cJSON_CreateObject();
            if (!c || !cJSON_AddNumberToObject(c, "index", index) || !cJSON_AddStringToObject(c, "id", "") ||
                !cJSON_AddStringToObject(c, "type", "function") || !cJSON_AddObjectToObject(c, "function")) {
                cJSON_Delete(c);
                return RLAI_ERR_NOMEM;
            }
            cJSON_AddItemToArray(calls, c);
        }
        const char *keys[] = { "id", "type" };
        for (int k = 0; k < 2; k++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(d, keys[k]);
            cJSON *nv = cJSON_IsString(v) ? cJSON_CreateString(v->valuestring) : NULL;
            if (cJSON_IsString(v) && (!nv || !cJSON_ReplaceItemInObjectCaseSensitive(c, keys[k], nv))) {
                cJSON_Delete(nv);
                return RLAI_ERR_NOMEM;
            }
        }
        const cJSON *fd = cJSON_GetObjectItemCaseSensitive(d, "function");
        cJSON *fc = cJSON_GetObjectItemCaseSensitive(c, "function");
        const char *fkeys[] = { "name", "arguments" };
        for (int k = 0; k < 2; k++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(fd, fkeys[k]);
            if (cJSON_IsString(v) && append_member(fc, fkeys[k], v->valuestring) < 0)
                return RLAI_ERR_NOMEM;
        }
    }
    return 0;
}

cJSON *rlai_tool_calls_message(const cJSON *calls)
{
    cJSON *out = cJSON_Duplicate(calls, 1);
    for (cJSON *c = out ? out->child : NULL; c; c = c->next) {
        cJSON_DeleteItemFromObjectCaseSensitive(c, "index");
        cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
        if (!cJSON_GetObjectItemCaseSensitive(fn, "name"))
            cJSON_AddStringToObject(fn, "name", "");
        if (!cJSON_GetObjectItemCaseSensitive(fn, "arguments"))
            cJSON_AddStringToObject(fn, "arguments", "");
    }
    return out;
}
