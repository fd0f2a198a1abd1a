/* profile.h - per-game screen profiles: the regions of interest to read
 * (health bar, ammo counter, minimap, dialogue box, ...) and the system
 * prompt of the analysis. JSON, validated strictly: an unknown key, a
 * wrong type or a rectangle outside the screen is refused with a message
 * naming it. Format: docs/SCREEN.md. */
#ifndef RLAI_SCREEN_PROFILE_H
#define RLAI_SCREEN_PROFILE_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "ocr.h"

#define RLAI_SCREEN_MAX_REGIONS 32
#define RLAI_SCREEN_MAX_PROMPT 8000     /* bytes of system prompt */
#define RLAI_SCREEN_PROFILE_MAX_BYTES (256 * 1024)

typedef struct rlai_screen_region {
    char name[33];              /* [a-z0-9_], unique in the profile */
    char label[129];            /* what it is, for the model ("Health bar"); name when absent */
    double x, y, w, h;          /* fractions of the frame, 0..1 */
    bool numbers;               /* "kind": "numbers": the numbers matter most */
} rlai_screen_region;

typedef struct rlai_screen_profile {
    char name[33];              /* [a-z0-9_-] */
    char *game;                 /* optional, owned ("" when absent) */
    char *system_prompt;        /* owned; "" = the plugin's default */
    rlai_screen_region *regions; /* owned */
    int n_regions;
    float min_confidence;       /* OCR words below are dropped; default 50 */
    bool other_text;            /* also describe text outside the regions; default true */
} rlai_screen_profile;

/* Validates a profile object and fills *out (the caller frees with
 * rlai_screen_profile_free; nothing to free on failure). j is borrowed.
 * Returns 0 or RLAI_ERR_INVALID_ARG (message in err) / RLAI_ERR_NOMEM. */
int rlai_screen_profile_parse(const cJSON *j, rlai_screen_profile *out, char *err, size_t errlen);

/* Reads and parses a profile file (at most RLAI_SCREEN_PROFILE_MAX_BYTES).
 * Errors as parse plus RLAI_ERR_IO / RLAI_ERR_NOT_FOUND / RLAI_ERR_FORMAT
 * (not JSON); the message names the file. */
int rlai_screen_profile_load(const char *path, rlai_screen_profile *out, char *err, size_t errlen);

void rlai_screen_profile_free(rlai_screen_profile *p);

/* The pixel box of a region in a w x h frame (at least 1x1, inside). */
rlai_screen_box rlai_screen_region_box(const rlai_screen_region *r, int w, int h);

/* True for a valid profile name: 1..32 of [a-z0-9_-], starting with a
 * letter or digit (the file <name>.json in a profiles folder). */
bool rlai_screen_profile_name_ok(const char *s);

#endif
