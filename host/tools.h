/* tools.h - structured output and function calling for the OpenAI front
 * (host/http.c): response_format to a grammar, and tools / tool_choice to
 * a system-turn description plus a grammar for the call, and back from the
 * generated text to tool_calls. docs/STRUCTURED.md describes the contract.
 *
 * The engine's chat formatter recognises template styles (ChatML, Llama-3,
 * Gemma), not Jinja, so no model's own tool-call syntax is used: the tools
 * are described in the system turn and the reply is constrained to the
 * JSON call object {"name": NAME, "arguments": {...}} (arguments valid
 * under the function's parameters schema). One call per reply.
 */
#ifndef RLAI_HOST_TOOLS_H
#define RLAI_HOST_TOOLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>
#include "rlai/grammar.h"

/* response_format (may be NULL or JSON null): {"type":"text"} -> *out NULL;
 * {"type":"json_object"}; {"type":"json_schema","json_schema":{"name",
 * "schema","strict","description"}}. On success returns 0 with *out a new
 * grammar (caller unrefs) or NULL. On failure returns a negative code and
 * writes a message for a 400 into err. */
int rlai_response_format_grammar(const cJSON *rf, rlai_grammar **out, char *err, size_t errlen);

typedef enum rlai_tool_mode {
    RLAI_TOOLS_OFF = 0,      /* no tools, or tool_choice "none" */
    RLAI_TOOLS_AUTO,         /* text or one call */
    RLAI_TOOLS_REQUIRED,     /* one call of any tool */
    RLAI_TOOLS_NAMED,        /* one call of the named tool */
} rlai_tool_mode;

typedef struct rlai_tools {
    rlai_tool_mode mode;
    cJSON *names;            /* array of the function names (owned) */
    char *system;            /* text for the system turn (owned), NULL when OFF */
    rlai_grammar *grammar;   /* call grammar (owned), NULL when OFF */
} rlai_tools;

/* The most tools one request may give: each is an alternative of the call
 * grammar, whose matcher follows at most 128 alternatives at once. */
#define RLAI_TOOLS_MAX 128

/* Reads "tools" and "tool_choice" of a chat body into *t (zeroed first;
 * mode OFF when there are no tools or tool_choice is "none"). Returns 0, or
 * a negative code with a message for a 400 in err and the offending
 * parameter's name in *param (static string). Free with rlai_tools_free. */
int rlai_tools_parse(const cJSON *body, rlai_tools *t, char *err, size_t errlen, const char **param);
void rlai_tools_free(rlai_tools *t);

/* The text of an input message for the chat template: an assistant turn
 * with "tool_calls" becomes its content followed by each call as the JSON
 * object the model is taught to write; a "tool" turn becomes a user turn
 * "Result of NAME (call ID): CONTENT" (NAME found from the earlier call
 * with that id in msgs, when there is one). *role_out is a static string.
 * Returns a malloc'd string, or NULL when out of memory. */
char *rlai_tools_message_text(const cJSON *msgs, const cJSON *msg, const char *role, const char *content,
                              const char **role_out);

/* When text is a call of one of t's tools, returns the OpenAI tool_calls
 * array ([{"id","type":"function","function":{"name","arguments"}}],
 * arguments as JSON text) with an id made from `salt`; else NULL. */
cJSON *rlai_tools_extract(const rlai_tools *t, const char *text, uint64_t salt);

/* Folds streamed tool-call fragments (a chunk's delta.tool_calls: [{index,
 * id, type, function: {name, arguments}}], borrowed) into `calls` (an
 * array this keeps, one object per index, in order of first appearance):
 * id and type are set, name and arguments appended, as OpenAI clients
 * accumulate them. Returns 0 or RLAI_ERR_NOMEM. */
int rlai_tool_calls_merge(cJSON *calls, const cJSON *deltas);

/* A message's "tool_calls" from merged calls (borrowed): each
 * {id, type, function: {name, arguments}} without its index. New array
 * (caller owns) or NULL when out of memory. */
cJSON *rlai_tool_calls_message(const cJSON *calls);

#endif
