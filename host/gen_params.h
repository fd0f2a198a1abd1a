/* gen_params.h - the explicit conversions into the engine's one
 * generation-params type (rlai_gen_params, rlai/engine.h) from the other
 * two shapes a request arrives in: the wire protocol's rlai_msg_gen
 * (rlai/protocol.h) and a plugin's rlai_gen_request (rlai/plugin.h).
 * tests/test_gen_params.c checks every field of both.
 *
 * Neither copies strings: pointers in *out (stop strings, logit biases) borrow from the
 * source, which must outlive the submit. Grammars (response_format),
 * callbacks and deadlines are the caller's. */
#ifndef RLAI_HOST_GEN_PARAMS_H
#define RLAI_HOST_GEN_PARAMS_H

#include "rlai/engine.h"
#include "rlai/plugin.h"
#include "rlai/protocol.h"

/* Wire request -> engine params: fields the client sent override the
 * product defaults (docs/DEFAULTS.md) with a fresh seed. out->stop is not
 * set (the wire's stop list is an array of its own; the caller builds the
 * NULL-terminated list). */
void rlai_gen_params_from_wire(const rlai_msg_gen *g, rlai_gen_params *out);

/* Plugin request -> engine params: the plugin ABI's zero-means-off rules
 * (temperature 0 = greedy, top_k 0 = off, top_p 0 or >= 1 = off, min_p
 * 0 = off, repeat_penalty 0 = off, max_tokens 0 = the engine default);
 * seed and stop as given. */
void rlai_gen_params_from_plugin(const rlai_gen_request *req, rlai_gen_params *out);

#endif
