/* lorepack.h - LoreMaster lore packs: parsing, validation and the system
 * prompt of every character (format: plugins/loremaster/README.md).
 *
 * A lorepack_set collects the characters of one or more pack files. Pure C
 * and cJSON: no host, no engine, no threads (a loaded set is read-only and
 * may then be shared by any number of threads).
 *
 * Errors are negative rlai_error codes; every failing function writes a
 * message naming the source (file path) and the problem into err (may be
 * NULL) and leaves the set as it was.
 */
#ifndef LOREMASTER_LOREPACK_H
#define LOREMASTER_LOREPACK_H

#include <stdbool.h>
#include <stddef.h>

#include <rlai/plugin.h>

/* Limits a pack must respect (a larger value is a format error). */
#define LOREPACK_MAX_FILE_BYTES (1u << 20)   /* one pack file */
#define LOREPACK_MAX_STR 4096                /* bytes of one text field */
#define LOREPACK_MAX_ID 32                   /* bytes of a character id */
#define LOREPACK_MAX_LIST 32                 /* items of one list */
#define LOREPACK_MAX_CHARS 256               /* characters in a set */
#define LOREPACK_MAX_PROMPT (24u << 10)      /* bytes of one system prompt */

/* Sampling defaults of a pack or a character. A field < 0 is unset. */
typedef struct lore_sampling {
    float temperature;      /* 0 .. 2 */
    float top_p;            /* (0, 1] */
    float repeat_penalty;   /* 0.5 .. 2 */
    int max_tokens;         /* 1 .. 4096 */
} lore_sampling;

/* One character, with everything owned by the set. */
typedef struct lore_character {
    char *id;               /* [a-z0-9_-]{1,32}, unique in the set */
    char *name;
    char *title;            /* "" when the pack gives none */
    char *world;            /* the world's name */
    char *source;           /* the pack it came from (path as given) */
    char *system_prompt;    /* world lore + persona + rules (UTF-8) */
    lore_sampling sampling; /* the character's own over the pack's */
} lore_character;

typedef struct lorepack_set {
    lore_character *chars;  /* in load order */
    int n, cap;
} lorepack_set;

/* Empties *s (no allocation). */
void lorepack_set_init(lorepack_set *s);

/* Frees what the set owns and empties it. Accepts NULL. */
void lorepack_set_free(lorepack_set *s);

/* Parses one pack from JSON text (len bytes, need not be NUL-terminated)
 * and adds its characters. `source` names it in messages and in
 * lore_character.source (copied). Returns the number of characters added,
 * or RLAI_ERR_FORMAT (malformed JSON with line and column, a missing or
 * ill-typed field, a value over a limit, an unknown key, a duplicate id,
 * also one already in the set), RLAI_ERR_TOO_LARGE (text over
 * LOREPACK_MAX_FILE_BYTES), RLAI_ERR_INVALID_ARG, RLAI_ERR_NOMEM. */
int lorepack_add_json(lorepack_set *s, const char *text, size_t len, const char *source,
                      char *err, size_t errlen);

/* Reads and adds one pack file. Returns as lorepack_add_json, plus
 * RLAI_ERR_IO when the file cannot be read. */
int lorepack_add_file(lorepack_set *s, const char *path, char *err, size_t errlen);

/* Adds a file, or every "*.json" of a folder (not recursive, in name
 * order; hidden files skipped). All or nothing: on failure the set is as it
 * was. Returns the number of characters added, RLAI_ERR_NOT_FOUND for a
 * folder without packs or a missing path, or as lorepack_add_file. */
int lorepack_add_path(lorepack_set *s, const char *path, char *err, size_t errlen);

/* The character with this id, or NULL (borrowed from the set). */
const lore_character *lorepack_find(const lorepack_set *s, const char *id);

/* Writes the ids of the set, comma separated, into buf (cut to fit,
 * always NUL-terminated when cap > 0). */
void lorepack_ids(const lorepack_set *s, char *buf, size_t cap);

#endif
