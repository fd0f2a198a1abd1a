/* gen_params.c - conversions into rlai_gen_params (gen_params.h). */
#include "gen_params.h"

#include <stddef.h>

void rlai_gen_params_from_wire(const rlai_msg_gen *g, rlai_gen_params *gp)
{
    rlai_gen_params_init(gp);
    rlai_sampler_params_product(&gp->sampling, rlai_fresh_seed());   /* docs/DEFAULTS.md */
    if (g->has_max_tokens) gp->max_tokens = g->max_tokens;
    if (g->has_temperature) gp->sampling.temperature = g->temperature;
    if (g->has_top_k) gp->sampling.top_k = g->top_k;
    if (g->has_top_p) gp->sampling.top_p = g->top_p;
    if (g->has_min_p) gp->sampling.min_p = g->min_p;
    if (g->has_repeat_penalty) gp->sampling.repeat_penalty = g->repeat_penalty;
    if (g->has_presence_penalty) gp->sampling.presence_penalty = g->presence_penalty;
    if (g->has_frequency_penalty) gp->sampling.frequency_penalty = g->frequency_penalty;
    if (g->has_seed) gp->sampling.seed = g->seed;
    gp->ignore_eos = g->ignore_eos;
    if (g->has_timeout_ms) gp->timeout_ms = g->timeout_ms;
    if (g->has_spec) gp->spec = (rlai_spec_mode)g->spec;
    if (g->has_spec_max_draft) gp->spec_max_draft = (int)g->spec_max_draft;
    if (g->has_top_logprobs) gp->top_logprobs = (int)g->top_logprobs;
    gp->prompt_logprobs = g->prompt_logprobs && g->has_top_logprobs;
    /* the wire's entries are the engine's (same layout), kept by the message */
    gp->logit_bias = (const rlai_logit_bias *)g->logit_bias;
    gp->n_logit_bias = (int)g->n_logit_bias;
    gp->prediction = g->prediction;
}

_Static_assert(sizeof(rlai_msg_logit_bias) == sizeof(rlai_logit_bias) &&
                   offsetof(rlai_msg_logit_bias, token) == offsetof(rlai_logit_bias, token) &&
                   offsetof(rlai_msg_logit_bias, bias) == offsetof(rlai_logit_bias, bias),
               "rlai_msg_logit_bias and rlai_logit_bias differ");

void rlai_gen_params_from_plugin(const rlai_gen_request *req, rlai_gen_params *gp)
{
    rlai_gen_params_init(gp);
    if (req->max_tokens > 0)
        gp->max_tokens = req->max_tokens;
    gp->sampling.temperature = req->temperature > 0 ? req->temperature : 0;
    gp->sampling.top_k = req->top_k > 0 ? req->top_k : 0;
    if (req->top_p > 0 && req->top_p < 1)
        gp->sampling.top_p = req->top_p;
    if (req->min_p > 0)
        gp->sampling.min_p = req->min_p;
    if (req->repeat_penalty > 0)
        gp->sampling.repeat_penalty = req->repeat_penalty;
    gp->sampling.seed = req->seed;
    gp->stop = req->stop;
    gp->prediction = req->prediction;       /* 1.4; zero for older plugins (smaller req_size) */
    /* the plugin's entries are the engine's (same layout), borrowed for the call */
    gp->logit_bias = (const rlai_logit_bias *)req->logit_bias;
    gp->n_logit_bias = req->n_logit_bias;
}

_Static_assert(sizeof(rlai_plugin_logit_bias) == sizeof(rlai_logit_bias) &&
                   offsetof(rlai_plugin_logit_bias, token) == offsetof(rlai_logit_bias, token) &&
                   offsetof(rlai_plugin_logit_bias, bias) == offsetof(rlai_logit_bias, bias),
               "rlai_plugin_logit_bias and rlai_logit_bias differ");
