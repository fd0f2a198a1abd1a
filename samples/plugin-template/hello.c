/* hello.c - a minimal RTX-LocalAI plugin: two commands.
 *
 *   hello.greet  {name}            replies at once with a JSON result
 *   hello.story  {topic, words}    streams a short story from the shared
 *                                  engine (the loaded language model)
 *
 * Build it out of tree against the installed headers (see README.md):
 *   make            # uses `pkg-config rlai-plugin`
 * then start the engine with the folder that holds this plugin's folder:
 *   rlai serve --plugins ~/.local/share/rlai/plugins
 */
#include <rlai/plugin.h>

#include <stdio.h>
#include <string.h>

/* The ABI record the host checks before calling rlai_plugin_init. */
RLAI_PLUGIN_DECLARE();

static const rlai_host_api *host;

/* hello.greet: reply at once. `params` is the caller's JSON object. */
static int greet(rlai_call *call, const cJSON *params, void *user)
{
    (void)user;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(params, "name");
    if (!cJSON_IsString(name) || !*name->valuestring)
        return host->reply_error(call, RLAI_ERR_INVALID_ARG, "name (a non-empty string) is required");
    char text[300];
    snprintf(text, sizeof(text), "Hello, %.200s!", name->valuestring);
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "greeting", text);
    return host->reply_json(call, r);   /* takes ownership of r */
}

/* hello.story: an engine job whose text streams to the caller. */
static int story(rlai_call *call, const cJSON *params, void *user)
{
    (void)user;
    const cJSON *topic = cJSON_GetObjectItemCaseSensitive(params, "topic");
    const cJSON *words = cJSON_GetObjectItemCaseSensitive(params, "words");
    if (!cJSON_IsString(topic) || !*topic->valuestring)
        return host->reply_error(call, RLAI_ERR_INVALID_ARG, "topic (a non-empty string) is required");
    int n = cJSON_IsNumber(words) ? (int)words->valuedouble : 60;
    if (n < 1 || n > 400)
        return host->reply_error(call, RLAI_ERR_INVALID_ARG, "words must be between 1 and 400");
    char ask[600];
    snprintf(ask, sizeof(ask), "Tell a very short story (about %d words) about %.400s.", n, topic->valuestring);
    rlai_plugin_message msgs[] = { { "user", ask } };
    rlai_gen_request req;
    memset(&req, 0, sizeof(req));     /* 0 = engine default for every field */
    req.messages = msgs;
    req.n_messages = 1;
    req.max_tokens = n * 2;
    req.temperature = 0.7f;
    req.stream = true;                /* tokens go to the caller as they come */
    rlai_gen_result res;
    int rc = host->generate(call, &req, sizeof(req), &res);   /* blocks this worker */
    if (rc < 0)
        return host->reply_error(call, rc, "the engine could not tell the story: %s", host->strerror(rc));
    cJSON *r = cJSON_CreateObject();
    cJSON_AddNumberToObject(r, "tokens", res.gen_tokens);
    cJSON_AddStringToObject(r, "stop", res.stop);
    host->free(res.text);             /* memory from the host goes back to the host */
    return host->reply_json(call, r);
}

RLAI_PLUGIN_EXPORT int rlai_plugin_init(const rlai_host_api *api, rlai_plugin *self, char **errmsg)
{
    (void)errmsg;
    host = api;
    const rlai_command_desc cmds[] = {
        { .name = "hello.greet",
          .description = "Greets a person by name. Use when the user asks to be greeted.",
          .params_schema = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\","
                           "\"description\":\"who to greet\"}},\"required\":[\"name\"]}",
          .handler = greet },
        { .name = "hello.story",
          .description = "Tells a very short story about a topic, streamed as it is written.",
          .params_schema = "{\"type\":\"object\",\"properties\":{\"topic\":{\"type\":\"string\"},"
                           "\"words\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":400}},"
                           "\"required\":[\"topic\"]}",
          .handler = story, .flags = RLAI_CMD_STREAMS | RLAI_CMD_USES_ENGINE },
    };
    for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
        int rc = api->register_command(self, &cmds[i], sizeof(cmds[i]));
        if (rc < 0)
            return rc;   /* the host undoes the other registrations */
    }
    return 0;
}
