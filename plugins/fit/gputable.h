/* gputable.h - the fit plugin's table of common NVIDIA GPUs (memory size
 * and memory bandwidth) and GPU name matching.
 *
 * Pure data and string code: no host, no allocation except where stated.
 * Sources and assumptions of every figure: plugins/fit/README.md.
 *
 * Units: vram_gib is the marketed memory size, read as GiB (2^30 bytes;
 * GDDR and HBM parts are sized in binary units: an "8 GB" card has 8 GiB);
 * bandwidth_gbs is the peak memory bandwidth in GB/s (10^9 bytes/s).
 */
#ifndef RLAI_FIT_GPUTABLE_H
#define RLAI_FIT_GPUTABLE_H

#include <rlai/plugin.h>

typedef struct rlai_fit_gpu {
    const char *name;          /* display name, e.g. "RTX 4060 Ti 16GB" */
    double vram_gib;           /* memory size (GiB) */
    double bandwidth_gbs;      /* peak memory bandwidth (GB/s) */
    bool unified;              /* memory shared with the CPU and the OS */
    const char *aliases;       /* '|'-separated other accepted names, or NULL */
} rlai_fit_gpu;

/* Number of entries in the table and entry i (0 <= i < count); borrowed,
 * static. */
int rlai_fit_gpu_count(void);
const rlai_fit_gpu *rlai_fit_gpu_at(int i);

/* Finds a GPU by name. Matching ignores case, spaces, '-' and '_', and the
 * words "NVIDIA" and "GeForce" ("nvidia geforce rtx4060" matches
 * "RTX 4060"); the normalized name must equal an entry's name or one of its
 * aliases. Returns 0 with *out set (borrowed, static); RLAI_ERR_INVALID_ARG
 * for an empty or NULL name; RLAI_ERR_NOT_FOUND for an unknown or
 * ambiguous name, with a message in err: the names that start with the
 * query when there are some ("did you mean ..."), else every known name. */
int rlai_fit_gpu_find(const char *name, const rlai_fit_gpu **out, char *err, size_t errlen);

/* The table as a JSON array of {"name", "vram_gb", "bandwidth_gbs",
 * "unified"}. Caller owns the result (cJSON_Delete); NULL when out of
 * memory. */
cJSON *rlai_fit_gpu_table_json(void);

#endif
