/* session.c - LoreMaster's conversation store (see session.h).
 *
 * Sizes are small (hundreds of sessions, a few characters each), so
 * sessions live in an array searched linearly and the least recently used
 * one is found by its use stamp. */
#include "session.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct convo {
    char *character;
    session_turn *turns;        /* oldest first */
    int n, cap;
    int n_total;
    uint64_t serial;
} convo;

typedef struct session {
    char *id;
    convo *convos;
    int n_convos;
    uint64_t used;              /* use stamp: larger = more recent */
} session;

struct session_store {
    pthread_mutex_t mu;
    session *sessions;
    int n, max_sessions, max_turns;
    uint64_t clock, next_serial;
};

static void turn_free(session_turn *t)
{
    free(t->user);
    free(t->reply);
    t->user = t->reply = NULL;
}

static void convo_free(convo *c)
{
    for (int i = 0; i < c->n; i++)
        turn_free(&c->turns[i]);
    free(c->turns);
    free(c->character);
    memset(c, 0, sizeof *c);
}

static void session_free(session *se)
{
    for (int i = 0; i < se->n_convos; i++)
        convo_free(&se->convos[i]);
    free(se->convos);
    free(se->id);
    memset(se, 0, sizeof *se);
}

bool session_id_ok(const char *id)
{
    if (!id)
        return false;
    size_t n = strlen(id);
    if (n == 0 || n > SESSION_MAX_ID)
        return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)id[i] < 0x21 || (unsigned char)id[i] > 0x7e)
            return false;
    return true;
}

int session_store_new(int max_sessions, int max_turns, session_store **out)
{
    if (!out)
        return RLAI_ERR_INVALID_ARG;
    *out = NULL;
    if (max_sessions < 1 || max_turns < 1)
        return RLAI_ERR_INVALID_ARG;
    session_store *s = calloc(1, sizeof *s);
    if (!s)
        return RLAI_ERR_NOMEM;
    s->sessions = calloc((size_t)max_sessions, sizeof *s->sessions);
    if (!s->sessions) {
        free(s);
        return RLAI_ERR_NOMEM;
    }
    pthread_mutex_init(&s->mu, NULL);
    s->max_sessions = max_sessions;
    s->max_turns = max_turns;
    s->next_serial = 1;
    *out = s;
    return 0;
}

void session_store_free(session_store *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->n; i++)
        session_free(&s->sessions[i]);
    free(s->sessions);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static session *find_session(session_store *s, const char *id, int *idx)
{
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->sessions[i].id, id) == 0) {
            if (idx)
                *idx = i;
            return &s->sessions[i];
        }
    return NULL;
}

static convo *find_convo(session *se, const char *character)
{
    for (int i = 0; i < se->n_convos; i++)
        if (strcmp(se->convos[i].character, character) == 0)
            return &se->convos[i];
    return NULL;
}

static void remove_session(session_store *s, int i)
{
    session_free(&s->sessions[i]);
    s->sessions[i] = s->sessions[s->n - 1];
    memset(&s->sessions[s->n - 1], 0, sizeof *s->sessions);
    s->n--;
}

/* Finds or creates (session, character); locked. */
static int get_convo(session_store *s, const char *sid, const char *character, convo **out)
{
    session *se = find_session(s, sid, NULL);
    if (!se) {
        if (s->n == s->max_sessions) {
            int lru = 0;
            for (int i = 1; i < s->n; i++)
                if (s->sessions[i].used < s->sessions[lru].used)
                    lru = i;
            remove_session(s, lru);
        }
        se = &s->sessions[s->n];
        memset(se, 0, sizeof *se);
        if (!(se->id = strdup(sid)))
            return RLAI_ERR_NOMEM;
        s->n++;
    }
    se->used = ++s->clock;
    convo *c = find_convo(se, character);
    if (!c) {
        convo *p = realloc(se->convos, (size_t)(se->n_convos + 1) * sizeof *p);
        if (!p)
            return RLAI_ERR_NOMEM;
        se->convos = p;
        c = &se->convos[se->n_convos];
        memset(c, 0, sizeof *c);
        if (!(c->character = strdup(character)))
            return RLAI_ERR_NOMEM;
        c->serial = s->next_serial++;
        se->n_convos++;
    }
    *out = c;
    return 0;
}

int session_store_snapshot(session_store *s, const char *session_id, const char *character,
                           session_history *out)
{
    if (!out)
        return RLAI_ERR_INVALID_ARG;
    memset(out, 0, sizeof *out);
    if (!s || !session_id_ok(session_id) || !character || !*character)
        return RLAI_ERR_INVALID_ARG;
    pthread_mutex_lock(&s->mu);
    convo *c;
    int rc = get_convo(s, session_id, character, &c);
    if (rc == 0 && c->n) {
        out->turns = calloc((size_t)c->n, sizeof *out->turns);
        if (!out->turns)
            rc = RLAI_ERR_NOMEM;
        for (int i = 0; rc == 0 && i < c->n; i++) {
            out->turns[i].user = strdup(c->turns[i].user);
            out->turns[i].reply = strdup(c->turns[i].reply);
            out->n++;
            if (!out->turns[i].user || !out->turns[i].reply)
                rc = RLAI_ERR_NOMEM;
        }
    }
    if (rc == 0) {
        out->n_total = c->n_total;
        out->serial = c->serial;
    }
    pthread_mutex_unlock(&s->mu);
    if (rc)
        session_history_free(out);
    return rc;
}

static void drop_oldest(convo *c, int k)
{
    if (k > c->n)
        k = c->n;
    if (k <= 0)
        return;
    for (int i = 0; i < k; i++)
        turn_free(&c->turns[i]);
    memmove(c->turns, c->turns + k, (size_t)(c->n - k) * sizeof *c->turns);
    c->n -= k;
}

int session_store_append(session_store *s, const char *session_id, const char *character, uint64_t serial,
                         const char *user, const char *reply, int drop, int *turn_no)
{
    if (!s || !session_id || !character || !user || !reply || drop < 0)
        return RLAI_ERR_INVALID_ARG;
    session_turn t = { strdup(user), strdup(reply) };
    if (!t.user || !t.reply) {
        turn_free(&t);
        return RLAI_ERR_NOMEM;
    }
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    session *se = find_session(s, session_id, NULL);
    convo *c = se ? find_convo(se, character) : NULL;
    if (!c || c->serial != serial) {
        rc = RLAI_ERR_NOT_FOUND;
    } else {
        drop_oldest(c, drop);
        if (c->n >= s->max_turns)
            drop_oldest(c, c->n - s->max_turns + 1);
        if (c->n == c->cap) {
            int cap = c->cap ? c->cap * 2 : 4;
            session_turn *p = realloc(c->turns, (size_t)cap * sizeof *p);
            if (!p)
                rc = RLAI_ERR_NOMEM;
            else {
                c->turns = p;
                c->cap = cap;
            }
        }
        if (rc == 0) {
            c->turns[c->n++] = t;
            t.user = t.reply = NULL;
            c->n_total++;
            se->used = ++s->clock;
            if (turn_no)
                *turn_no = c->n_total;
        }
    }
    pthread_mutex_unlock(&s->mu);
    turn_free(&t);
    return rc;
}

bool session_store_reset(session_store *s, const char *session_id)
{
    if (!s || !session_id)
        return false;
    pthread_mutex_lock(&s->mu);
    int i;
    bool found = find_session(s, session_id, &i) != NULL;
    if (found)
        remove_session(s, i);
    pthread_mutex_unlock(&s->mu);
    return found;
}

int session_store_count(session_store *s)
{
    if (!s)
        return 0;
    pthread_mutex_lock(&s->mu);
    int n = s->n;
    pthread_mutex_unlock(&s->mu);
    return n;
}

void session_history_free(session_history *h)
{
    if (!h)
        return;
    for (int i = 0; i < h->n; i++)
        turn_free(&h->turns[i]);
    free(h->turns);
    memset(h, 0, sizeof *h);
}
