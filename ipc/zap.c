/* zap.c - ZAP handler for PLAIN with one fixed user (see zap.h). */
#include "zap.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "rlai/error.h"

#define ZAP_ENDPOINT "inproc://zeromq.zap.01"
#define ZAP_MAX_PARTS 16

struct rlai_zap {
    void *sock;
    pthread_t thread;
    char *user, *password;
    size_t user_len, password_len;
};

/* Constant-time equality of a received credential with the expected one
 * (the time depends only on the lengths). */
static bool ct_equal(const void *a, size_t alen, const char *b, size_t blen)
{
    const unsigned char *x = a;
    const unsigned char *y = (const unsigned char *)b;
    unsigned diff = (unsigned)(alen ^ blen);
    for (size_t i = 0; i < blen; i++)
        diff |= (unsigned)(y[i] ^ (i < alen ? x[i] : 0u));
    return diff == 0 && blen > 0;
}

static void reply(void *sock, const zmq_msg_t *reqid, const char *code, const char *text)
{
    zmq_send(sock, "1.0", 3, ZMQ_SNDMORE);
    zmq_send(sock, zmq_msg_data((zmq_msg_t *)reqid), zmq_msg_size((zmq_msg_t *)reqid), ZMQ_SNDMORE);
    zmq_send(sock, code, strlen(code), ZMQ_SNDMORE);
    zmq_send(sock, text, strlen(text), ZMQ_SNDMORE);
    zmq_send(sock, "", 0, ZMQ_SNDMORE); /* user id */
    zmq_send(sock, "", 0, 0);           /* metadata */
}

static void *zap_main(void *arg)
{
    rlai_zap *z = arg;
    for (;;) {
        zmq_msg_t part[ZAP_MAX_PARTS];
        int n = 0;
        bool more = true, term = false;
        while (more) {
            zmq_msg_t m;
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, z->sock, 0) < 0) {
                zmq_msg_close(&m);
                if (zmq_errno() == EINTR)
                    continue;
                term = true;
                break;
            }
            more = zmq_msg_more(&m);
            if (n < ZAP_MAX_PARTS)
                part[n++] = m;
            else
                zmq_msg_close(&m);
        }
        if (!term && n >= 2) {
            /* version, request id, domain, address, routing id, mechanism, credentials... */
            bool ok = n == 8 && zmq_msg_size(&part[0]) == 3 && !memcmp(zmq_msg_data(&part[0]), "1.0", 3) &&
                      zmq_msg_size(&part[5]) == 5 && !memcmp(zmq_msg_data(&part[5]), "PLAIN", 5);
            bool user_ok = ok && ct_equal(zmq_msg_data(&part[6]), zmq_msg_size(&part[6]), z->user, z->user_len);
            bool pass_ok = ok && ct_equal(zmq_msg_data(&part[7]), zmq_msg_size(&part[7]), z->password,
                                          z->password_len);
            if (user_ok & pass_ok)
                reply(z->sock, &part[1], "200", "OK");
            else
                reply(z->sock, &part[1], "400", "invalid API key");
        } else if (!term && n > 0) {
            zmq_msg_t empty;
            zmq_msg_init(&empty);
            reply(z->sock, &empty, "500", "malformed ZAP request");
            zmq_msg_close(&empty);
        }
        for (int i = 0; i < n; i++)
            zmq_msg_close(&part[i]);
        if (term)
            break;
    }
    int linger = 0;
    zmq_setsockopt(z->sock, ZMQ_LINGER, &linger, sizeof linger);
    zmq_close(z->sock);
    z->sock = NULL;
    return NULL;
}

static void zap_free(rlai_zap *z)
{
    if (z->sock)
        zmq_close(z->sock);
    free(z->user);
    free(z->password);
    free(z);
}

int rlai_zap_start(void *zctx, const char *user, const char *password, rlai_zap **out, char *err,
                   size_t errlen)
{
    *out = NULL;
    if (!zctx || !user || !password || !*password) {
        snprintf(err, errlen, "ZAP handler: missing context, user or password");
        return RLAI_ERR_INVALID_ARG;
    }
    rlai_zap *z = calloc(1, sizeof *z);
    if (!z)
        return RLAI_ERR_NOMEM;
    z->user = strdup(user);
    z->password = strdup(password);
    if (!z->user || !z->password) {
        zap_free(z);
        return RLAI_ERR_NOMEM;
    }
    z->user_len = strlen(user);
    z->password_len = strlen(password);
    z->sock = zmq_socket(zctx, ZMQ_REP);
    if (!z->sock) {
        snprintf(err, errlen, "ZAP handler: zmq_socket: %s", zmq_strerror(zmq_errno()));
        zap_free(z);
        return RLAI_ERR_IO;
    }
    if (zmq_bind(z->sock, ZAP_ENDPOINT) < 0) {
        int e = zmq_errno();
        snprintf(err, errlen, "ZAP handler: cannot bind %s: %s", ZAP_ENDPOINT, zmq_strerror(e));
        zap_free(z);
        return e == EADDRINUSE ? RLAI_ERR_EXISTS : RLAI_ERR_IO;
    }
    if (pthread_create(&z->thread, NULL, zap_main, z) != 0) {
        snprintf(err, errlen, "ZAP handler: cannot start its thread");
        zap_free(z);
        return RLAI_ERR_NOMEM;
    }
    *out = z;
    return 0;
}

void rlai_zap_stop(rlai_zap *z)
{
    if (!z)
        return;
    pthread_join(z->thread, NULL);
    zap_free(z);
}
