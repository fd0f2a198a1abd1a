/* scheduler.h - what engine.c calls of the scheduler half (scheduler.c).
 * Private to engine/. */
#ifndef RLAI_ENGINE_SCHEDULER_H
#define RLAI_ENGINE_SCHEDULER_H

#include "engine_impl.h"

/* Frees a request that never reached on_done (engine close): its KV
 * blocks, sampler, matcher, stream and copies. NULL is fine. */
void rlai_sched_req_free(rlai_engine *e, rlai_req *r);

/* Copies the KV pool figures into the stats snapshot (hold step_mu). */
void rlai_sched_refresh_kv_stats(rlai_engine *e);

#endif
