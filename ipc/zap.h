/* zap.h - a ZeroMQ authentication (ZAP, RFC 27) handler for the PLAIN
 * mechanism with one fixed username and password (the engine's API key).
 *
 * libzmq asks the handler bound at inproc://zeromq.zap.01 in the socket's
 * context for every PLAIN handshake on a listener that has
 * ZMQ_PLAIN_SERVER set; this one answers 200 when username and password
 * match (compared in constant time) and 400 otherwise, and refuses other
 * mechanisms. One thread per handler.
 */
#ifndef RLAI_IPC_ZAP_H
#define RLAI_IPC_ZAP_H

#include <stddef.h>

typedef struct rlai_zap rlai_zap;

/* Binds the handler in zctx and starts its thread. user and password are
 * copied. Returns 0 or a negative rlai_error with a message in err
 * (RLAI_ERR_EXISTS when another handler is bound in that context).
 * *out owned by the caller (rlai_zap_stop). */
int rlai_zap_start(void *zctx, const char *user, const char *password, rlai_zap **out, char *err,
                   size_t errlen);

/* Joins the thread and frees. Call after zmq_ctx_shutdown(zctx) (which ends
 * the thread's blocking receive) and before zmq_ctx_term. Accepts NULL. */
void rlai_zap_stop(rlai_zap *z);

#endif
