/* gassist_manifest.h - the G-Assist view of the engine's command registry:
 * how command names map to G-Assist function names, and the plugin's
 * manifest.json generated from the live registry (protocol `commands`),
 * so the manifest and what the engine runs never disagree.
 *
 * Name mapping (G-Assist function names are snake_case, must be unique
 * across all installed plugins, and the prefix "rise_" is reserved):
 *   command "loremaster.talk"  ->  function "loremaster_talk"
 * i.e. lower-case, every '.' and '-' becomes '_'; only [a-z0-9_] remain
 * and the result is at most RLAI_GASSIST_MAX_FUNCTION bytes. The reverse
 * direction is not computed from the text ("a_b.c" and "a.b_c" would
 * collide) but looked up in the registry (rlai_gassist_registry_find);
 * a registry in which two commands map to one function name is refused.
 *
 * Parameters named RLAI_GASSIST_SESSION_PARAM are managed by the bridge
 * (passthrough conversations) and are left out of the manifest.
 *
 * Self-contained apart from gassist_msgpack.c, so the `rlai` executable
 * links the two files for `rlai gassist manifest`. Any thread; no global
 * state.
 */
#ifndef RLAI_GASSIST_MANIFEST_H
#define RLAI_GASSIST_MANIFEST_H

#include <stdio.h>

#include <cjson/cJSON.h>

#include "rlai/client.h"

#ifndef RLAI_GASSIST_VERSION
#define RLAI_GASSIST_VERSION RLAI_VERSION
#endif

#define RLAI_GASSIST_MAX_FUNCTION 64
#define RLAI_GASSIST_SESSION_PARAM "session"
#define RLAI_GASSIST_DEFAULT_NAME "rlai"
#if defined(_WIN32)
#define RLAI_GASSIST_DEFAULT_EXECUTABLE "rlai-gassist.exe"
#else
#define RLAI_GASSIST_DEFAULT_EXECUTABLE "rlai-gassist"
#endif

typedef struct rlai_gassist_manifest_opts {
    const char *endpoint;       /* engine endpoint; NULL = $RLAI_ENDPOINT, else the default */
    const char *name;           /* plugin name = its folder name; NULL = "rlai" */
    const char *executable;     /* NULL = RLAI_GASSIST_DEFAULT_EXECUTABLE */
    const char *description;    /* NULL = a generic one */
    int timeout_ms;             /* per engine round trip; <= 0 = 3000 */
} rlai_gassist_manifest_opts;

/* Writes the G-Assist function name of `command` into buf. Returns 0,
 * RLAI_ERR_INVALID_ARG when the command has characters outside
 * [A-Za-z0-9._-], is empty, or maps into the reserved "rise_" prefix,
 * RLAI_ERR_TOO_LARGE when the name would exceed RLAI_GASSIST_MAX_FUNCTION
 * bytes or cap. */
int rlai_gassist_function_name(const char *command, char *buf, size_t cap);

/* Asks the engine for its registry (protocol `commands`) over an open
 * client. On success *out is {"commands": [...]} as the engine sent it
 * (caller deletes). Returns 0 or a negative rlai_error with a message in
 * err (RLAI_ERR_TIMEOUT, RLAI_ERR_DISCONNECTED, RLAI_ERR_PROTOCOL). */
int rlai_gassist_fetch_registry(rlai_client *c, int timeout_ms, cJSON **out, char *err, size_t errlen);

/* The registry entry ({"name", "description", "parameters", ...}) whose
 * command maps to `function`, or whose name equals it; NULL if none.
 * Borrowed from registry. */
const cJSON *rlai_gassist_registry_find(const cJSON *registry, const char *function);

/* Builds the manifest object from a registry. Commands whose name cannot
 * be mapped are skipped with a line on stderr. Returns the manifest
 * (caller deletes), or NULL with a message in err: no usable command,
 * two commands with one function name, out of memory. */
cJSON *rlai_gassist_manifest_build(const cJSON *registry, const rlai_gassist_manifest_opts *o,
                                   char *err, size_t errlen);

/* Connects to the engine, fetches the registry and writes the manifest as
 * indented JSON to `path` (replaced atomically: written to PATH.tmp, then
 * renamed), or to stdout when path is NULL or "-". Returns 0 or a negative
 * rlai_error with a message in err. */
int rlai_gassist_manifest_save(const rlai_gassist_manifest_opts *o, const char *path, char *err,
                               size_t errlen);

/* The same with default options, writing to an open stream. */
int rlai_gassist_manifest(const char *endpoint, FILE *out, char *err, size_t errlen);

/* `rlai gassist manifest [--endpoint E] [-o FILE] [--name N]
 * [--executable X]`: argv[0] is "gassist". Returns the process exit
 * status (0, 1 on failure, 2 on a usage error); messages go to stderr. */
int rlai_gassist_manifest_main(int argc, char **argv);

#endif
