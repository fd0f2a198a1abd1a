/* chat_repl.h - the interactive loop of `rlai chat`.
 *
 * Reads lines (libedit line editing and a history file when stdin is a
 * terminal and the build found libedit; plain getline otherwise), keeps the
 * conversation and hands the whole of it to a generate callback each turn.
 * Commands: /help, /reset (asks for confirmation), /system TEXT, /save FILE
 * (the messages as JSON). An empty line is ignored. Ctrl-C while a reply
 * streams stops that reply and keeps the conversation; Ctrl-C at an empty
 * prompt, or Ctrl-D, quits.
 *
 * History: $XDG_STATE_HOME/rlai/chat_history, else
 * ~/.local/state/rlai/chat_history, mode 0600 (folders made 0700).
 *
 * Terminal input is decoded as UTF-8: LC_CTYPE is set to the user's locale
 * when that is UTF-8, else to C.UTF-8, for the time of the loop.
 *
 * Threads: one thread; installs a SIGINT handler (and a self-pipe that
 * wakes the line reader, whichever thread takes the signal) for the time
 * of the loop and puts the previous handler back at the end. */
#ifndef RLAI_CHAT_REPL_H
#define RLAI_CHAT_REPL_H

#include "rlai/engine.h"

#include <stdbool.h>
#include <stddef.h>

/* Generates the assistant's reply to msgs[0..n) and streams it to stdout;
 * stores the text (malloc'd, may be partial after Ctrl-C, owned by the
 * caller of the callback afterwards) in *reply. It should poll
 * rlai_chat_repl_interrupted() and stop early when it turns true. Returns
 * 0, or a negative rlai_error (the turn is then dropped). */
typedef int (*rlai_chat_generate_fn)(void *user, const rlai_chat_message *msgs, int n, char **reply);

typedef struct rlai_chat_repl_params {
    const char *system;               /* first system prompt, or NULL (borrowed) */
    rlai_chat_generate_fn generate;
    void *user;
    bool end_on_error;                /* a failed turn ends the chat (a lost engine connection) */
} rlai_chat_repl_params;

/* Runs the loop until Ctrl-D / Ctrl-C at an empty prompt. Returns the
 * exit status: 0, or 1 when it ended on an error. */
int rlai_chat_repl_run(const rlai_chat_repl_params *p);

/* True once Ctrl-C was pressed during the current reply (async-signal
 * flag, read by the generate callback). */
bool rlai_chat_repl_interrupted(void);

/* Path of the history file into buf (folders not created). Returns 0, or
 * RLAI_ERR_NOT_FOUND when neither XDG_STATE_HOME nor HOME is set,
 * RLAI_ERR_TOO_LARGE when it does not fit. */
int rlai_chat_history_path(char *buf, size_t cap);

/* Writes msgs as {"messages": [{"role", "content"}, ...]} to path.
 * Returns 0 or a negative rlai_error with the reason in err. */
int rlai_chat_save_json(const char *path, const rlai_chat_message *msgs, int n, char *err, size_t errlen);

#endif
