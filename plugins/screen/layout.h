/* layout.h - OCR text -> a compact description of the screen for a
 * language model, and the same as JSON for the caller.
 *
 * The description lists the profile's regions first (label, the text read
 * in that region's crop, its numbers), then the other text on screen top
 * to bottom with a coarse position (top-left ... bottom-right), e.g.
 *
 *     Screen 1280x720.
 *     Health (health): "HP 87/100"; numbers: 87, 100
 *     Other text on the screen, top to bottom:
 *     - top-left: "QUEST: Cross the bridge"
 *     - bottom-center: "The bridge is guarded by three archers."
 *
 * It is cut at max_chars (whole lines; the cut is said). */
#ifndef RLAI_SCREEN_LAYOUT_H
#define RLAI_SCREEN_LAYOUT_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "ocr.h"
#include "profile.h"

/* Builds the description of a w x h frame. profile may be NULL (no
 * regions). region_text[i] is the text read in profile->regions[i]'s box
 * (may be NULL when the profile has none); full is the text of the whole
 * frame (lines whose centre lies in a region are left out of "other text";
 * full may be NULL when profile->other_text is false). All borrowed.
 * *text: malloc'd description (the caller frees). *json (may be NULL to
 * skip): {"regions": {name: {"label","box","text","numbers"}}, "lines":
 * [{"text","where","x","y","width","height","confidence"}], "truncated"}
 * owned by the caller. Returns 0 or RLAI_ERR_NOMEM. */
int rlai_screen_layout_describe(int w, int h, const rlai_screen_profile *profile, const rlai_screen_text *region_text,
                                const rlai_screen_text *full, size_t max_chars, char **text, cJSON **json);

/* The numbers in s (integers and decimals, a leading '-' when it follows
 * no letter or digit), at most cap written to out; returns the count found
 * (may exceed cap). "HP 87/100" -> 87, 100. */
int rlai_screen_numbers(const char *s, double *out, int cap);

/* Coarse position of a box centre in a w x h frame: "top-left",
 * "top-center", ..., "bottom-right" (static). */
const char *rlai_screen_where(rlai_screen_box b, int w, int h);

#endif
