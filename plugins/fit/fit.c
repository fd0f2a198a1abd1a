/* fit.c - the fit plugin ("can it run?"): entry point and commands.
 *
 *   fit.check  memory needed by a model (GGUF header or parameter counts)
 *              on a GPU: weights, KV cache, activations, a fits/doesn't
 *              verdict with headroom, and an estimated decode speed
 *   fit.gpus   the table of known GPUs (memory size, bandwidth)
 *
 * The computation is in fitcalc.c, the GPU table in gputable.c; this file
 * only adapts them to the host. No engine is needed. */
#include <rlai/plugin.h>

#include "fitcalc.h"
#include "gputable.h"

RLAI_PLUGIN_DECLARE();

static const char check_schema[] =
    "{\"type\":\"object\",\"properties\":{"
    "\"model\":{\"description\":\"absolute path of a GGUF file (only its header is read), or an object "
    "{params_b, n_layer, n_head_kv, head_dim, bits_per_weight[, n_embd, n_ff, n_vocab, name]}\","
    "\"oneOf\":[{\"type\":\"string\"},{\"type\":\"object\",\"required\":[\"params_b\",\"n_layer\","
    "\"n_head_kv\",\"head_dim\",\"bits_per_weight\"],\"properties\":{"
    "\"params_b\":{\"type\":\"number\",\"description\":\"parameters in billions\"},"
    "\"n_layer\":{\"type\":\"integer\"},\"n_head_kv\":{\"type\":\"integer\"},"
    "\"head_dim\":{\"type\":\"integer\"},\"bits_per_weight\":{\"type\":\"number\"},"
    "\"n_embd\":{\"type\":\"integer\"},\"n_ff\":{\"type\":\"integer\"},\"n_vocab\":{\"type\":\"integer\"},"
    "\"n_head\":{\"type\":\"integer\"},\"n_ctx_train\":{\"type\":\"integer\"},"
    "\"name\":{\"type\":\"string\"}}}]},"
    "\"gpu\":{\"type\":\"string\",\"description\":\"GPU name, e.g. \\\"RTX 4060\\\" (see fit.gpus)\"},"
    "\"vram_gb\":{\"type\":\"number\",\"exclusiveMinimum\":0,\"maximum\":1000000,\"description\":\"GPU "
    "memory in GiB, instead of or overriding gpu\"},"
    "\"bandwidth_gbs\":{\"type\":\"number\",\"exclusiveMinimum\":0,\"maximum\":1000000,\"description\":"
    "\"memory bandwidth in GB/s, instead of or overriding gpu\"},"
    "\"context\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":16777216,\"default\":8192,"
    "\"description\":\"tokens of context to hold in the KV cache\"},"
    "\"kv_type\":{\"type\":\"string\",\"enum\":[\"f16\",\"q8_0\",\"f32\"],\"default\":\"f16\"}"
    "}}";

static int cmd_check(rlai_call *call, const cJSON *params, void *user)
{
    const rlai_host_api *h = user;
    rlai_fit_describe_fn describe = RLAI_HOST_HAS(h, gguf_describe) ? h->gguf_describe : NULL;
    char err[1024] = "";
    cJSON *out = NULL;
    int rc = rlai_fit_check(params, describe, &out, err, sizeof err);
    if (rc < 0) {
        /* An unreadable file or an unknown GPU is the caller's bad request
         * (the protocol's NOT_FOUND means an unknown command, ENGINE a
         * failed inference); the message says what is wrong. */
        if (rc == RLAI_ERR_IO || rc == RLAI_ERR_FORMAT || rc == RLAI_ERR_UNSUPPORTED ||
            rc == RLAI_ERR_NOT_FOUND)
            rc = RLAI_ERR_INVALID_ARG;
        return h->reply_error(call, rc, "%s", err[0] ? err : h->strerror(rc));
    }
    return h->reply_json(call, out);
}

static int cmd_gpus(rlai_call *call, const cJSON *params, void *user)
{
    (void)params;
    const rlai_host_api *h = user;
    cJSON *r = cJSON_CreateObject();
    cJSON *t = rlai_fit_gpu_table_json();
    if (!r || !t || !cJSON_AddItemToObject(r, "gpus", t)) {
        cJSON_Delete(r);
        cJSON_Delete(t);
        return h->reply_error(call, RLAI_ERR_NOMEM, "out of memory");
    }
    return h->reply_json(call, r);
}

RLAI_PLUGIN_EXPORT int rlai_plugin_init(const rlai_host_api *host, rlai_plugin *self, char **errmsg)
{
    (void)errmsg;
    const rlai_command_desc cmds[] = {
        { .name = "fit.check",
          .description = "Can a model run on a GPU? Reads a GGUF file's header (or takes parameter "
                         "counts) and returns the memory needed for the weights (by tensor type and "
                         "bits per weight), the KV cache per 1k tokens and at the requested context, "
                         "an activation estimate, whether it fits in the GPU's memory with the "
                         "headroom left, and an estimated decode speed in tokens/s.",
          .params_schema = check_schema,
          .handler = cmd_check,
          .user = (void *)host },
        { .name = "fit.gpus",
          .description = "Lists the GPUs fit.check knows, with memory size (GiB) and memory "
                         "bandwidth (GB/s).",
          .params_schema = "{\"type\":\"object\",\"properties\":{}}",
          .handler = cmd_gpus,
          .user = (void *)host },
    };
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        int rc = host->register_command(self, &cmds[i], sizeof cmds[i]);
        if (rc < 0)
            return rc;
    }
    return 0;
}
