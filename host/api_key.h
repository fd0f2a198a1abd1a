/* api_key.h - the engine's API key for its network endpoints (HTTP and
 * the optional ZeroMQ tcp:// endpoint).
 *
 * The key is resolved, first match wins, from: the config's
 * "auth": {"api_key"}, the environment variable RLAI_API_KEY, the config's
 * "auth": {"api_key_file"} (--api-key-file), else the default key file
 * $XDG_CONFIG_HOME/rlai/api_key ($HOME/.config/rlai/api_key). A key file
 * that does not exist is created: 32 random bytes from getrandom(),
 * hex-encoded (64 characters and a newline), mode 0600, with O_CREAT |
 * O_EXCL | O_NOFOLLOW, its folder made 0700. An existing key file is
 * refused when it is a symbolic link, not a regular file, not owned by the
 * effective uid, or readable or writable by group or others.
 */
#ifndef RLAI_HOST_API_KEY_H
#define RLAI_HOST_API_KEY_H

#include <stdbool.h>
#include <stddef.h>

#define RLAI_API_KEY_MAX 256

typedef struct rlai_api_key {
    char key[RLAI_API_KEY_MAX + 1];  /* the key (NUL-terminated) */
    char source[4096 + 64];          /* where it came from: a file path, "config auth.api_key" or
                                        "environment RLAI_API_KEY" (never the key itself) */
    bool from_file;                  /* source is a key file */
    bool created;                    /* the key file was created by this call */
} rlai_api_key;

/* Resolves the key as above into *out (caller-owned). config_key and
 * config_file may be NULL. Returns 0, or RLAI_ERR_IO / RLAI_ERR_FORMAT with
 * a message in err naming the file and what is wrong. */
int rlai_api_key_resolve(const char *config_key, const char *config_file, rlai_api_key *out, char *err,
                         size_t errlen);

/* Reads an existing key file with the checks above, without creating it.
 * Returns 0, RLAI_ERR_NOT_FOUND when it does not exist, or RLAI_ERR_IO /
 * RLAI_ERR_FORMAT with a message. key has room for RLAI_API_KEY_MAX + 1. */
int rlai_api_key_read_file(const char *path, char *key, char *err, size_t errlen);

/* The default key file path into buf. Returns 0 or RLAI_ERR_TOO_LARGE /
 * RLAI_ERR_NOT_FOUND (neither XDG_CONFIG_HOME nor HOME set). */
int rlai_api_key_default_path(char *buf, size_t cap);

/* Compares a presented key (len bytes, not NUL-terminated) with the
 * expected one in time independent of where they differ. */
bool rlai_api_key_equal(const char *given, size_t len, const char *expected);

#endif
