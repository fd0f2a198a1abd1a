/* backend.c - device selection and backend loading (see backend.h). */
#include "backend.h"
#include "rlai/error.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef RLAI_BACKEND_LIBDIR
#define RLAI_BACKEND_LIBDIR "/usr/local/lib/rlai"
#endif

#define CUDA_MODULE "rlai-backend-cuda.so"

int rlai_device_parse(const char *spec, rlai_device_kind *kind, int *index, char *err, size_t errlen)
{
    *kind = RLAI_DEVICE_AUTO;
    *index = 0;
    if (!spec || !*spec || !strcmp(spec, "auto"))
        return 0;
    if (!strcmp(spec, "cpu")) {
        *kind = RLAI_DEVICE_CPU;
        return 0;
    }
    if (!strncmp(spec, "cuda", 4)) {
        const char *p = spec + 4;
        if (*p == 0) {
            *kind = RLAI_DEVICE_CUDA;
            return 0;
        }
        if (*p == ':' && p[1] >= '0' && p[1] <= '9') {
            char *end;
            errno = 0;
            long v = strtol(p + 1, &end, 10);
            if (*end == 0 && errno == 0 && v >= 0 && v < 64) {
                *kind = RLAI_DEVICE_CUDA;
                *index = (int)v;
                return 0;
            }
        }
    }
    return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG,
                "device '%.40s' is not one of auto, cpu, cuda, cuda:N", spec);
}

/* Tries the places a backend module may live; returns a dlopen handle or
 * NULL with the last reason in why. */
static void *open_module(const char *file, char *why, size_t whylen)
{
    char path[4096];
    /* $RLAI_BACKEND_DIR, <exe>/../lib/rlai (an install), <exe>/../engine/
     * backend-cuda (the build tree: build/host/rlai), the install libdir. */
    char exedir[4096], rel[2][4096 + 32];
    const char *dirs[4] = { getenv("RLAI_BACKEND_DIR"), NULL, NULL, RLAI_BACKEND_LIBDIR };
    ssize_t n = readlink("/proc/self/exe", exedir, sizeof(exedir) - 1);
    if (n > 0) {
        exedir[n] = 0;
        char *slash = strrchr(exedir, '/');
        if (slash) {
            *slash = 0;
            snprintf(rel[0], sizeof(rel[0]), "%.4000s/../lib/rlai", exedir);
            snprintf(rel[1], sizeof(rel[1]), "%.4000s/../engine/backend-cuda", exedir);
            dirs[1] = rel[0];
            dirs[2] = rel[1];
        }
    }
    snprintf(why, whylen, "%s not found (this build has no CUDA backend, or it is not installed)", file);
    for (int i = 0; i < 4; i++) {
        if (!dirs[i] || !*dirs[i])
            continue;
        snprintf(path, sizeof(path), "%.4000s/%.64s", dirs[i], file);
        if (access(path, R_OK) != 0)
            continue;
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (h)
            return h;
        const char *e = dlerror();
        snprintf(why, whylen, "%.200s: %.200s", path, e ? e : "dlopen failed");
    }
    return NULL;
}

static int open_cuda(const rlai_backend_options *opt, int index, rlai_backend **out, char *err, size_t errlen)
{
    char why[512];
    void *h = open_module(CUDA_MODULE, why, sizeof(why));
    if (!h)
        return rlai_errf(err, errlen, RLAI_ERR_UNSUPPORTED, "CUDA backend: %s", why);
    rlai_backend_module_open_fn fn;
    *(void **)&fn = dlsym(h, "rlai_backend_module_open");
    if (!fn) {
        dlclose(h);
        return rlai_errf(err, errlen, RLAI_ERR_UNSUPPORTED, "CUDA backend: module has no rlai_backend_module_open");
    }
    char merr[256] = "";
    int rc = fn(RLAI_BACKEND_IFACE_VERSION, index, opt->max_ctx, out, merr, sizeof(merr));
    if (rc < 0) {
        dlclose(h);
        return rlai_errf(err, errlen, rc, "CUDA backend: %s", merr[0] ? merr : "could not start");
    }
    if (!*out || (*out)->iface->version != RLAI_BACKEND_IFACE_VERSION) {
        if (*out)
            (*out)->iface->free(*out);
        *out = NULL;
        dlclose(h);
        return rlai_errf(err, errlen, RLAI_ERR_UNSUPPORTED, "CUDA backend: interface version mismatch");
    }
    /* The module stays loaded for the life of the process: its code backs
     * the table the engine now holds. */
    return 0;
}

int rlai_backend_open(const rlai_backend_options *opt, rlai_backend **out,
                      char *err, size_t errlen, char *note, size_t notelen)
{
    *out = NULL;
    if (note && notelen)
        note[0] = 0;
    rlai_device_kind kind;
    int index;
    int rc = rlai_device_parse(opt->device, &kind, &index, err, errlen);
    if (rc < 0)
        return rc;
    if (kind == RLAI_DEVICE_CUDA)
        return open_cuda(opt, index, out, err, errlen);
    if (kind == RLAI_DEVICE_AUTO && access("/dev/nvidiactl", F_OK) == 0) {
        char cerr[512];
        if (open_cuda(opt, 0, out, cerr, sizeof(cerr)) == 0)
            return 0;
        if (note && notelen)
            snprintf(note, notelen, "device auto: %s; using the CPU", cerr);
    }
    rc = rlai_backend_cpu_new(opt->kernels, opt->pool, opt->max_ctx, out);
    if (rc < 0)
        return rlai_errf(err, errlen, rc, "CPU backend: %s", rlai_strerror(rc));
    return 0;
}

void rlai_backend_free(rlai_backend *be)
{
    if (be)
        be->iface->free(be);
}
