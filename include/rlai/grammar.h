/* rlai/grammar.h - grammars for constrained generation (structured output).
 *
 * A grammar is compiled from a JSON Schema (a documented subset, see
 * docs/STRUCTURED.md) or is the generic "any JSON object" grammar of
 * response_format json_object. Passed in rlai_gen_params.grammar, it makes
 * the engine mask, at every step, the tokens whose bytes cannot continue a
 * text the grammar accepts; end-of-generation is allowed only once the text
 * is complete, and generation stops by itself when nothing can follow.
 *
 * Grammars are immutable and reference-counted: rlai_grammar_ref() and
 * rlai_grammar_unref() are thread-safe, so one grammar may serve many
 * requests at once (the engine takes its own reference at submit).
 *
 * The byte-level matcher is public for tests and tools (validate a text
 * against a grammar); the engine uses its own token-level matcher.
 */
#ifndef RLAI_GRAMMAR_H
#define RLAI_GRAMMAR_H

#include <stddef.h>
#include <stdbool.h>
#include "rlai/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rlai_grammar rlai_grammar;

/* Compiles a JSON Schema (JSON text, len bytes, need not be NUL-terminated).
 * On success *out owns a new grammar (one reference). On failure *out is
 * NULL, a negative code is returned and err (if errlen > 0) names the
 * problem: RLAI_ERR_INVALID_ARG for text that is not JSON or a malformed
 * schema, RLAI_ERR_UNSUPPORTED for a keyword outside the supported subset
 * (the message names the keyword, e.g. "JSON Schema keyword 'pattern' is
 * not supported"), RLAI_ERR_TOO_LARGE for a schema over the size limits. */
int rlai_grammar_from_json_schema(const char *schema, size_t len, rlai_grammar **out,
                                  char *err, size_t errlen);

/* As rlai_grammar_from_json_schema, with flags:
 * RLAI_GRAMMAR_OR_TEXT: the schema's JSON (after at most 4 whitespace
 * bytes), or any text whose first byte is not '{' or whitespace, or
 * nothing (tool_choice "auto": the model answers in text or calls). */
#define RLAI_GRAMMAR_OR_TEXT 1u
int rlai_grammar_from_json_schema_flags(const char *schema, size_t len, unsigned flags, rlai_grammar **out,
                                        char *err, size_t errlen);

/* The generic grammar of response_format json_object: any JSON object.
 * *out owns a new grammar. Returns 0 or RLAI_ERR_NOMEM. */
int rlai_grammar_json_object(rlai_grammar **out);

/* Takes a reference (returns g). Thread-safe. */
rlai_grammar *rlai_grammar_ref(const rlai_grammar *g);
/* Drops a reference; frees the grammar with the last one. Accepts NULL. */
void rlai_grammar_unref(rlai_grammar *g);

/* True when the whole of text[0..len) is a complete sentence of g. */
bool rlai_grammar_accepts(const rlai_grammar *g, const char *text, size_t len);

/* Incremental byte-level matching. A matcher holds a reference to its
 * grammar; free it with rlai_grammar_matcher_free (accepts NULL). */
typedef struct rlai_grammar_matcher rlai_grammar_matcher;
int rlai_grammar_matcher_new(const rlai_grammar *g, rlai_grammar_matcher **out);
void rlai_grammar_matcher_free(rlai_grammar_matcher *m);
/* Advances over n bytes. Returns 0, or RLAI_ERR_INVALID_ARG when some byte
 * cannot continue an accepted text (the state is then unchanged), or
 * RLAI_ERR_NOMEM. */
int rlai_grammar_matcher_feed(rlai_grammar_matcher *m, const char *bytes, size_t n);
/* The bytes fed so far form a complete sentence. */
bool rlai_grammar_matcher_can_end(const rlai_grammar_matcher *m);
/* Complete and no byte can follow (generation stops here). */
bool rlai_grammar_matcher_done(const rlai_grammar_matcher *m);
/* The bytes every accepted continuation of the present state starts with
 * (a required property's key, the rest of a literal): up to cap of them
 * are written to buf (caller-owned); stops where two bytes could follow or
 * the text could end. The state is unchanged. Returns the count (0..cap)
 * or RLAI_ERR_INVALID_ARG / RLAI_ERR_NOMEM. */
int rlai_grammar_matcher_forced(rlai_grammar_matcher *m, char *buf, int cap);

#ifdef __cplusplus
}
#endif
#endif
