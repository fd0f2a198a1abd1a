/* session.h - LoreMaster's conversation store: the turns of every
 * (session, character) pair, bounded in sessions (least recently used
 * evicted) and in turns per conversation (oldest dropped).
 *
 * Thread-safe: every function takes the store's own mutex for a short
 * copy or update and never calls out while holding it, so a handler takes
 * a snapshot, runs its (long) generation unlocked, then appends the turn.
 *
 * A conversation has a serial number that changes when it is reset or
 * evicted and recreated: an append with the serial of an older snapshot is
 * dropped, so a reset during a generation really forgets it.
 *
 * Errors: negative rlai_error codes.
 */
#ifndef LOREMASTER_SESSION_H
#define LOREMASTER_SESSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <rlai/plugin.h>

#define SESSION_MAX_ID 128   /* bytes of a session id */

typedef struct session_store session_store;

typedef struct session_turn {
    char *user;             /* what the player said */
    char *reply;            /* what the character answered */
} session_turn;

/* A copy of one conversation, owned by the caller (session_history_free). */
typedef struct session_history {
    session_turn *turns;    /* oldest first */
    int n;
    int n_total;            /* turns ever stored, dropped ones included */
    uint64_t serial;        /* identity of the conversation copied */
} session_history;

/* Creates a store for at most max_sessions sessions (>= 1) of at most
 * max_turns turns per character (>= 1). *out owned by the caller
 * (session_store_free). Returns 0, RLAI_ERR_INVALID_ARG or RLAI_ERR_NOMEM. */
int session_store_new(int max_sessions, int max_turns, session_store **out);

/* Frees the store and everything in it. Accepts NULL. */
void session_store_free(session_store *s);

/* True when id is a valid session id: 1..SESSION_MAX_ID bytes, printable
 * ASCII (0x21..0x7e). */
bool session_id_ok(const char *id);

/* Copies the conversation of (session, character) into *out, creating an
 * empty one when absent (which may evict the least recently used session)
 * and marking the session as most recently used. Returns 0,
 * RLAI_ERR_INVALID_ARG (bad ids) or RLAI_ERR_NOMEM. */
int session_store_snapshot(session_store *s, const char *session, const char *character,
                           session_history *out);

/* Appends a turn (both strings copied) to the conversation whose serial is
 * `serial` (from a snapshot), after dropping its `drop` oldest turns (the
 * caller had to leave them out to fit the context), and keeps at most
 * max_turns. *turn_no (may be NULL) receives the turn's number (1 for the
 * first of the conversation). Returns 0, RLAI_ERR_NOT_FOUND when the
 * conversation was reset or evicted since the snapshot (nothing stored),
 * RLAI_ERR_INVALID_ARG or RLAI_ERR_NOMEM. */
int session_store_append(session_store *s, const char *session, const char *character, uint64_t serial,
                         const char *user, const char *reply, int drop, int *turn_no);

/* Forgets a session (all its characters). Returns true if it existed. */
bool session_store_reset(session_store *s, const char *session);

/* Number of sessions held. */
int session_store_count(session_store *s);

/* Frees what a history owns and empties it. Accepts NULL. */
void session_history_free(session_history *h);

#endif
