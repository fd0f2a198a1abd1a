/* gputable.c - common NVIDIA GPUs and name matching (see gputable.h; the
 * figures' sources are listed in README.md). */
#include "gputable.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

/* Aliases include the names nvidia-smi prints for the data-centre parts
 * ("NVIDIA H100 80GB HBM3" is the SXM part, "NVIDIA GB10" the DGX Spark). */
static const rlai_fit_gpu table[] = {
    { "RTX 4060",               8,   272,  false, NULL },
    { "RTX 4060 Ti 8GB",        8,   288,  false, NULL },
    { "RTX 4060 Ti 16GB",       16,  288,  false, NULL },
    { "RTX 4070",               12,  504,  false, NULL },
    { "RTX 4070 Super",         12,  504,  false, NULL },
    { "RTX 4070 Ti",            12,  504,  false, NULL },
    { "RTX 4070 Ti Super",      16,  672,  false, NULL },
    { "RTX 4080",               16,  717,  false, NULL },
    { "RTX 4080 Super",         16,  736,  false, NULL },
    { "RTX 4090",               24,  1008, false, NULL },
    { "RTX 5060",               8,   448,  false, NULL },
    { "RTX 5060 Ti 8GB",        8,   448,  false, NULL },
    { "RTX 5060 Ti 16GB",       16,  448,  false, NULL },
    { "RTX 5070",               12,  672,  false, NULL },
    { "RTX 5070 Ti",            16,  896,  false, NULL },
    { "RTX 5080",               16,  960,  false, NULL },
    { "RTX 5090",               32,  1792, false, NULL },
    { "RTX PRO 6000 Blackwell", 96,  1792, false,
      "RTX PRO 6000|RTX PRO 6000 Blackwell Workstation Edition" },
    { "DGX Spark",              128, 273,  true,  "GB10" },
    { "H100 SXM",               80,  3350, false, "H100 SXM5|H100 80GB HBM3" },
    { "H100 PCIe",              80,  2000, false, NULL },
    { "H200",                   141, 4800, false, "H200 SXM|H200 NVL" },
};

#define N_GPUS ((int)(sizeof table / sizeof table[0]))

int rlai_fit_gpu_count(void) { return N_GPUS; }

const rlai_fit_gpu *rlai_fit_gpu_at(int i)
{
    return i >= 0 && i < N_GPUS ? &table[i] : NULL;
}

/* Lower-cases s[0..n) into out, dropping spaces, '-' and '_', then removes
 * the words "nvidia" and "geforce". Returns false when it does not fit. */
static bool normalize(const char *s, size_t n, char *out, size_t cap)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (isspace(c) || c == '-' || c == '_')
            continue;
        if (k + 1 >= cap)
            return false;
        out[k++] = (char)tolower(c);
    }
    out[k] = '\0';
    static const char *const drop[] = { "nvidia", "geforce" };
    for (size_t d = 0; d < sizeof drop / sizeof drop[0]; d++) {
        size_t dl = strlen(drop[d]);
        char *p;
        while ((p = strstr(out, drop[d])) != NULL)
            memmove(p, p + dl, strlen(p + dl) + 1);
    }
    return true;
}

/* Calls fn(key) for the entry's name and each alias, normalized; stops and
 * returns true when fn does. */
static bool each_key(const rlai_fit_gpu *g, bool (*fn)(const char *key, const char *q), const char *q)
{
    char key[96];
    if (normalize(g->name, strlen(g->name), key, sizeof key) && fn(key, q))
        return true;
    for (const char *a = g->aliases; a && *a;) {
        const char *bar = strchr(a, '|');
        size_t n = bar ? (size_t)(bar - a) : strlen(a);
        if (normalize(a, n, key, sizeof key) && fn(key, q))
            return true;
        a = bar ? bar + 1 : a + n;
    }
    return false;
}

static bool key_equals(const char *key, const char *q) { return strcmp(key, q) == 0; }
static bool key_starts(const char *key, const char *q) { return strncmp(key, q, strlen(q)) == 0; }

/* Appends "a, b, c" of the entries selected by sel (NULL = all) to err. */
static void list_names(char *err, size_t errlen, size_t *len, const bool *sel)
{
    bool first = true;
    for (int i = 0; i < N_GPUS; i++) {
        if (sel && !sel[i])
            continue;
        if (*len < errlen) {
            int w = snprintf(err + *len, errlen - *len, "%s%s", first ? "" : ", ", table[i].name);
            if (w > 0)
                *len += (size_t)w;
        }
        first = false;
    }
}

int rlai_fit_gpu_find(const char *name, const rlai_fit_gpu **out, char *err, size_t errlen)
{
    *out = NULL;
    char q[96];
    if (!name || !normalize(name, strlen(name), q, sizeof q) || q[0] == '\0') {
        if (errlen)
            snprintf(err, errlen, "GPU name %s", name && *name ? "too long" : "empty");
        return RLAI_ERR_INVALID_ARG;
    }
    for (int i = 0; i < N_GPUS; i++) {
        if (each_key(&table[i], key_equals, q)) {
            *out = &table[i];
            return 0;
        }
    }
    bool sel[N_GPUS];
    int n_prefix = 0;
    for (int i = 0; i < N_GPUS; i++) {
        sel[i] = each_key(&table[i], key_starts, q);
        n_prefix += sel[i];
    }
    if (errlen) {
        size_t len = 0;
        int w;
        if (n_prefix > 0)
            w = snprintf(err, errlen, "GPU '%s' is ambiguous; did you mean: ", name);
        else
            w = snprintf(err, errlen, "unknown GPU '%s' (for another card give vram_gb and bandwidth_gbs, "
                         "in the CLI --vram-gb and --bandwidth-gbs); known GPUs: ", name);
        len = w > 0 ? (size_t)w : 0;
        list_names(err, errlen, &len, n_prefix > 0 ? sel : NULL);
    }
    return RLAI_ERR_NOT_FOUND;
}

cJSON *rlai_fit_gpu_table_json(void)
{
    cJSON *arr = cJSON_CreateArray();
    if (!arr)
        return NULL;
    for (int i = 0; i < N_GPUS; i++) {
        cJSON *o = cJSON_CreateObject();
        if (!o || !cJSON_AddItemToArray(arr, o)) {
            cJSON_Delete(o);
            cJSON_Delete(arr);
            return NULL;
        }
        if (!cJSON_AddStringToObject(o, "name", table[i].name) ||
            !cJSON_AddNumberToObject(o, "vram_gb", table[i].vram_gib) ||
            !cJSON_AddNumberToObject(o, "bandwidth_gbs", table[i].bandwidth_gbs) ||
            !cJSON_AddBoolToObject(o, "unified", table[i].unified)) {
            cJSON_Delete(arr);  /* o is attached: freed with arr */
            return NULL;
        }
    }
    return arr;
}
