/* conn_guard.c - slow-client guard of the HTTP front (see conn_guard.h). */
#include "conn_guard.h"
#include "rlai/clock.h"
#include "rlai/deadline.h"
#include "rlai/error.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

struct rlai_conn_slot {
    rlai_conn_slot *prev, *next;
    int fd;
    struct sockaddr_storage peer;   /* to tell a reused fd number apart */
    socklen_t peer_len;
    double t_wait;                  /* when it started waiting (monotonic s) */
    bool busy;
    bool shut;                      /* already shut down by the guard */
};

struct rlai_conn_guard {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t reaper;
    bool stop;
    int max_conns;
    double timeout_s;
    rlai_conn_slot *head, *tail;    /* in order of accept */
    int n_open;
    uint64_t n_timed_out, n_evicted;
};

/* Shuts the slot's socket down (its server thread then sees EOF and closes
 * it) when the fd still is the connection the slot was made for. */
static void shut_slot(rlai_conn_slot *s)
{
    struct sockaddr_storage peer;
    socklen_t len = sizeof(peer);
    s->shut = true;
    if (getpeername(s->fd, (struct sockaddr *)&peer, &len) != 0 || len != s->peer_len ||
        memcmp(&peer, &s->peer, len) != 0)
        return;
    shutdown(s->fd, SHUT_RDWR);
}

static void *reaper_main(void *arg)
{
    rlai_conn_guard *g = arg;
    pthread_mutex_lock(&g->mu);
    while (!g->stop) {
        struct timespec ts;
        rlai_deadline_in(&ts, CLOCK_MONOTONIC, 200);
        pthread_cond_timedwait(&g->cv, &g->mu, &ts);
        double t = rlai_clock_s();
        for (rlai_conn_slot *s = g->head; s; s = s->next) {
            if (!s->busy && !s->shut && t - s->t_wait > g->timeout_s) {
                shut_slot(s);
                g->n_timed_out++;
            }
        }
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

int rlai_conn_guard_new(int max_conns, int request_timeout_ms, rlai_conn_guard **out)
{
    *out = NULL;
    if (max_conns <= 0 || request_timeout_ms <= 0)
        return RLAI_ERR_INVALID_ARG;
    rlai_conn_guard *g = calloc(1, sizeof(*g));
    if (!g)
        return RLAI_ERR_NOMEM;
    g->max_conns = max_conns;
    g->timeout_s = request_timeout_ms / 1000.0;
    pthread_mutex_init(&g->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&g->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&g->reaper, NULL, reaper_main, g) != 0) {
        pthread_cond_destroy(&g->cv);
        pthread_mutex_destroy(&g->mu);
        free(g);
        return RLAI_ERR_NOMEM;
    }
    *out = g;
    return 0;
}

void rlai_conn_guard_free(rlai_conn_guard **gp)
{
    if (!gp || !*gp)
        return;
    rlai_conn_guard *g = *gp;
    pthread_mutex_lock(&g->mu);
    g->stop = true;
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
    pthread_join(g->reaper, NULL);
    for (rlai_conn_slot *s = g->head; s;) {
        rlai_conn_slot *n = s->next;
        free(s);
        s = n;
    }
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
    *gp = NULL;
}

rlai_conn_slot *rlai_conn_guard_opened(rlai_conn_guard *g, int fd)
{
    rlai_conn_slot *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->fd = fd;
    s->peer_len = sizeof(s->peer);
    if (getpeername(fd, (struct sockaddr *)&s->peer, &s->peer_len) != 0)
        s->peer_len = 0;
    s->t_wait = rlai_clock_s();
    pthread_mutex_lock(&g->mu);
    s->prev = g->tail;
    if (g->tail)
        g->tail->next = s;
    else
        g->head = s;
    g->tail = s;
    g->n_open++;
    /* Over capacity: the connection waiting longest for its request makes
     * room (the list is in accept order, but keep-alive connections wait
     * from their last answer, so compare times). */
    int live = 0;
    for (rlai_conn_slot *o = g->head; o; o = o->next)
        live += !o->shut;
    while (live > g->max_conns) {
        rlai_conn_slot *oldest = NULL;
        for (rlai_conn_slot *o = g->head; o; o = o->next)
            if (o != s && !o->busy && !o->shut && (!oldest || o->t_wait < oldest->t_wait))
                oldest = o;
        if (!oldest)
            break;           /* every other connection is busy: nothing to evict */
        shut_slot(oldest);
        g->n_evicted++;
        live--;
    }
    pthread_mutex_unlock(&g->mu);
    return s;
}

void rlai_conn_guard_closed(rlai_conn_guard *g, rlai_conn_slot *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&g->mu);
    if (s->prev)
        s->prev->next = s->next;
    else
        g->head = s->next;
    if (s->next)
        s->next->prev = s->prev;
    else
        g->tail = s->prev;
    g->n_open--;
    pthread_mutex_unlock(&g->mu);
    free(s);
}

void rlai_conn_guard_set_busy(rlai_conn_guard *g, rlai_conn_slot *s, bool busy)
{
    if (!s)
        return;
    pthread_mutex_lock(&g->mu);
    s->busy = busy;
    if (!busy)
        s->t_wait = rlai_clock_s();
    pthread_mutex_unlock(&g->mu);
}

void rlai_conn_guard_counts(rlai_conn_guard *g, uint64_t *timed_out, uint64_t *evicted, int *open)
{
    pthread_mutex_lock(&g->mu);
    if (timed_out)
        *timed_out = g->n_timed_out;
    if (evicted)
        *evicted = g->n_evicted;
    if (open)
        *open = g->n_open;
    pthread_mutex_unlock(&g->mu);
}
