/* router.c - the one generation path of the host (router.h). */
#include "router.h"

#include <stdlib.h>

#include "rlai/error.h"

struct rlai_router {
    rlai_engine *engine;              /* borrowed */
};

int rlai_router_new(rlai_engine *engine, rlai_router **out)
{
    if (!engine || !out)
        return RLAI_ERR_INVALID_ARG;
    rlai_router *r = calloc(1, sizeof(*r));
    if (!r)
        return RLAI_ERR_NOMEM;
    r->engine = engine;
    *out = r;
    return 0;
}

void rlai_router_free(rlai_router *r)
{
    free(r);
}

int rlai_router_submit(rlai_router *r, const rlai_route_request *rq, uint64_t *id, int *n_prompt,
                       char *err, size_t errlen)
{
    if (!r || !rq)
        return rlai_engine_submit_text(NULL, NULL, id, n_prompt, err, errlen);
    return rlai_engine_submit_text(r->engine, &rq->text, id, n_prompt, err, errlen);
}

int rlai_router_cancel(rlai_router *r, uint64_t id)
{
    return r ? rlai_engine_cancel(r->engine, id) : RLAI_ERR_NOT_FOUND;
}

rlai_engine *rlai_router_engine(const rlai_router *r)
{
    return r ? r->engine : NULL;
}
