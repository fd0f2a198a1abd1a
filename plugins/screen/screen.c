/* screen.c - the screen plugin: capture, read and analyse what the player
 * sees (plugins/screen/README.md, docs/SCREEN.md).
 *
 *   screen.analyze  a question + an image source -> the screen's text read
 *                   by OCR (Tesseract), laid out as a compact description
 *                   (profile regions first), and the model's streamed answer
 *   screen.capture  a source -> PNG (base64 in the result, or a new file)
 *   screen.sources  the display's screen size and titled windows
 *
 * Sources: "file" (PNG/JPEG path), "image" (PNG/JPEG bytes as base64),
 * "window" (an X11 window by title), else the whole X11 screen; "display"
 * names the X display (default $DISPLAY of the engine). Pixels stay in
 * memory; nothing is written unless screen.capture is given "save_to".
 *
 * Analysis modes: "ocr" (OCR + the loaded language model), "vision" (the
 * engine's vision encoder from an mmproj GGUF: the frame's pixels go to the
 * model with the question, refused with NOT_IMPLEMENTED when the engine has
 * no encoder), "auto" (vision when the engine has an encoder, else ocr).
 * With config "model" naming a remote model the answers run there, and
 * vision sends the frame as a PNG data URL (rlai_gen_request.image_url);
 * "auto" picks vision when "remote_vision" is set.
 *
 * Handlers run on several workers at once: the state is read-only after
 * init except the OCR pool, which locks itself. */
#include <rlai/plugin.h>
#include <rlai/plugin_json.h>

#include <dirent.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base64.h"
#include "capture.h"
#include "image.h"
#include "imgdecode.h"
#include "layout.h"
#include "ocr.h"
#include "pngenc.h"
#include "profile.h"

RLAI_PLUGIN_DECLARE();

#define MAX_QUESTION 2000
#define MAX_PROFILES 64
#define DEFAULT_PROMPT_CHARS 3000
#define DEFAULT_MAX_TOKENS 200
#define RESULT_DATA_MAX (900u * 1024u)   /* base64 PNG in a result (the host refuses ~1 MiB) */

static const char DEFAULT_SYSTEM[] =
    "You are a tactical assistant for a video game player. You get the text read from the player's screen by "
    "OCR, with where each piece appears (health, ammo, quest text, dialogue), and the player's question. Answer "
    "briefly and concretely, using what the screen shows; say so when the screen does not show enough.";

typedef struct screen_plugin {
    const rlai_host_api *host;
    rlai_plugin *self;
    rlai_screen_ocr *ocr;           /* NULL when Tesseract could not start (ocr_error says why) */
    char ocr_error[512];
    rlai_screen_profile *profiles;
    int n_profiles;
    char default_profile[33];
    rlai_screen_limits limits;
    int max_prompt_chars, max_tokens;
    float temperature;
    int no_shm;
    char mmproj[512];               /* configured vision projector ("" = none) */
    char model[257];                /* config "model": where answers run ("" = the local model; a
                                       remote model of the host's upstreams, docs/REMOTE.md) */
    bool remote_vision;             /* config "remote_vision": that remote model sees images */
} screen_plugin;

/* ---- helpers ------------------------------------------------------------- */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static uint64_t fresh_seed(void)
{
    static atomic_uint_fast64_t counter;
    uint64_t x = (uint64_t)(now_ms() * 1000.0) + 0x9E3779B97F4A7C15u * (uint64_t)(atomic_fetch_add(&counter, 1) + 1);
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9u;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBu;
    return (x ^ (x >> 31)) & ((1ull << 53) - 1);
}

static char *host_strdup(const rlai_host_api *h, const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = h->alloc(n);
    if (p)
        memcpy(p, s, n);
    return p;
}

/* A display a caller may name: local only (":N" or ":N.S"), so a call
 * cannot make the engine open connections to other hosts. The engine's own
 * $DISPLAY (the operator's) is not restricted. */
static bool local_display(const char *d)
{
    if (d[0] != ':' || !(d[1] >= '0' && d[1] <= '9'))
        return false;
    const char *p = d + 1;
    while (*p >= '0' && *p <= '9')
        p++;
    if (*p == '.') {
        if (!(p[1] >= '0' && p[1] <= '9'))
            return false;
        for (p++; *p >= '0' && *p <= '9'; p++)
            ;
    }
    return *p == '\0' && p - d <= 12;
}

/* Errors a caller caused (bad file, corrupt data) are BAD_REQUEST; an
 * unknown file or window stays NOT_FOUND, a limit TOO_LARGE. */
static int caller_code(int rc)
{
    return rc == RLAI_ERR_FORMAT || rc == RLAI_ERR_EXISTS ? RLAI_ERR_INVALID_ARG : rc;
}

/* ---- sources ------------------------------------------------------------- */

typedef struct frame {
    rlai_screen_image img;
    cJSON *source;              /* description for the result (owned) */
    double acquire_ms, decode_ms;
} frame;

static void frame_free(frame *f)
{
    rlai_screen_image_free(&f->img);
    cJSON_Delete(f->source);
    memset(f, 0, sizeof *f);
}

/* Gets the frame the params name. On failure replies with the error and
 * returns it. */
static int get_frame(screen_plugin *sp, rlai_call *call, const cJSON *params, frame *f)
{
    const rlai_host_api *h = sp->host;
    memset(f, 0, sizeof *f);
    bool bad = false;
    const char *file = rlai_json_opt_str(params, "file", &bad);
    const char *image = rlai_json_opt_str(params, "image", &bad);
    const char *window = rlai_json_opt_str(params, "window", &bad);
    const char *display = rlai_json_opt_str(params, "display", &bad);
    if (bad)
        return h->reply_error(call, RLAI_ERR_INVALID_ARG, "\"file\", \"image\", \"window\" and \"display\" must be strings");
    if ((file != NULL) + (image != NULL) + (window != NULL) > 1)
        return h->reply_error(call, RLAI_ERR_INVALID_ARG,
                              "give at most one source: \"file\", \"image\" or \"window\" (none = the whole screen)");
    if (display && !local_display(display))
        return h->reply_error(call, RLAI_ERR_INVALID_ARG,
                              "\"display\" must be a local X display such as \":0\" or \":1.0\"");
    if (display && (file || image))
        return h->reply_error(call, RLAI_ERR_INVALID_ARG, "\"display\" applies to live captures only (window or screen)");
    char err[1024] = "";
    int rc;
    f->source = cJSON_CreateObject();
    if (!f->source)
        return h->reply_error(call, RLAI_ERR_NOMEM, "out of memory");
    double t0 = now_ms();
    if (file || image) {
        uint8_t *bytes = NULL;
        size_t len = 0;
        if (file) {
            if (file[0] != '/')
                return h->reply_error(call, RLAI_ERR_INVALID_ARG, "\"file\" must be an absolute path");
            rc = rlai_screen_read_file(file, &sp->limits, &bytes, &len, err, sizeof err);
            cJSON_AddStringToObject(f->source, "kind", "file");
            cJSON_AddStringToObject(f->source, "path", file);
        } else {
            rc = rlai_screen_b64_decode(image, strlen(image), sp->limits.max_bytes, &bytes, &len);
            if (rc == RLAI_ERR_FORMAT)
                snprintf(err, sizeof err, "\"image\" is not valid base64");
            else if (rc == RLAI_ERR_TOO_LARGE)
                snprintf(err, sizeof err, "\"image\" decodes to more than %zu bytes", sp->limits.max_bytes);
            cJSON_AddStringToObject(f->source, "kind", "image");
        }
        if (rc)
            return h->reply_error(call, caller_code(rc), "%s", err[0] ? err : h->strerror(rc));
        double t1 = now_ms();
        const char *fmt = rlai_screen_image_format(bytes, len);
        rc = rlai_screen_decode(bytes, len, &sp->limits, &f->img, err, sizeof err);
        free(bytes);
        f->acquire_ms = t1 - t0;
        f->decode_ms = now_ms() - t1;
        if (rc)
            return h->reply_error(call, caller_code(rc), "%s", err);
        cJSON_AddStringToObject(f->source, "format", fmt ? fmt : "");
        cJSON_AddNumberToObject(f->source, "bytes", (double)len);
    } else {
        rlai_screen_capture_opts o = { .display = display, .title = window,
                                       .max_pixels = sp->limits.max_pixels, .no_shm = sp->no_shm };
        rlai_screen_capture_info info;
        rc = rlai_screen_capture(&o, &f->img, &info, err, sizeof err);
        f->acquire_ms = now_ms() - t0;
        if (rc)
            return h->reply_error(call, caller_code(rc), "%s", err);
        cJSON_AddStringToObject(f->source, "kind", window ? "window" : "screen");
        if (window) {
            cJSON_AddStringToObject(f->source, "title", info.title);
            cJSON_AddNumberToObject(f->source, "window_id", info.window_id);
        }
        cJSON_AddNumberToObject(f->source, "x", info.x);
        cJSON_AddNumberToObject(f->source, "y", info.y);
        cJSON_AddBoolToObject(f->source, "shm", info.used_shm);
    }
    cJSON_AddNumberToObject(f->source, "width", f->img.width);
    cJSON_AddNumberToObject(f->source, "height", f->img.height);
    return 0;
}

/* ---- screen.sources ------------------------------------------------------ */

static int cmd_sources(rlai_call *call, const cJSON *params, void *user)
{
    static const char *const keys[] = { "display", NULL };
    screen_plugin *sp = user;
    const rlai_host_api *h = sp->host;
    char err[1024];
    if (rlai_json_check_keys(params, keys, err, sizeof err))
        return h->reply_error(call, RLAI_ERR_INVALID_ARG, "%s", err);
    bool bad = false;
    const char *display = rlai_json_opt_str(params, "display", &bad);
    if (bad || (display && !local_display(display)))
        return h->reply_error(call, RLAI_ERR_INVALID_ARG,
                              "\"display\" must be a local X display such as \":0\" or \":1.0\"");
    cJSON *out = NULL;
    int rc = rlai_screen_sources(display, &out, err, sizeof err);
    if (rc)
        return h->reply_error(call, caller_code(rc), "%s", err);
    h->reply_json(call, out);
    return 0;
}

/* ---- screen.capture ------------------------------------------------------ */

/* The optional "region" param: [x, y, w, h] fractions -> a crop of f. */
static int apply_region(screen_plugin *sp, rlai_call *call, const cJSON *params, frame *f)
{
    const cJSON *reg = cJSON_GetObjectItemCaseSensitive(params, "region");
    if (!reg)
        return 0;
    cJSON *wrap = cJSON_CreateObject();
    cJSON *copy = cJSON_Duplicate(reg, 1);
    if (!wrap || !copy) {
        cJSON_Delete(wrap);
        cJSON_Delete(copy);
        return sp->host->reply_error(call, RLAI_ERR_NOMEM, "out of memory");
    }
    cJSON_AddStringToObject(wrap, "name", "region");
    cJSON_AddItemToObject(wrap, "rect", copy);
    rlai_screen_region r;
    char err[512];
    rlai_screen_profile p;
    cJSON *prof = cJSON_CreateObject();
    cJSON *arr = prof ? cJSON_AddArrayToObject(prof, "regions") : NULL;
    int rc = RLAI_ERR_NOMEM;
    if (arr && cJSON_AddStringToObject(prof, "name", "capture") && cJSON_AddItemToArray(arr, wrap)) {
        wrap = NULL;
        rc = rlai_screen_profile_parse(prof, &p, err, sizeof err);
    }
    cJSON_Delete(wrap);
    cJSON_Delete(prof);
    if (rc) {
        if (rc == RLAI_ERR_INVALID_ARG)
            return sp->host->reply_error(call, rc, "\"region\" must be [x, y, width, height], fractions of the frame "
                                                   "in 0..1 inside it");
        return sp->host->reply_error(call, rc, "out of memory");
    }
    r = p.regions[0];
    rlai_screen_profile_free(&p);
    rlai_screen_box b = rlai_screen_region_box(&r, f->img.width, f->img.height);
    rlai_screen_image crop;
    if ((rc = rlai_screen_image_crop(&f->img, b.x, b.y, b.w, b.h, &crop)) != 0)
        return sp->host->reply_error(call, rc, "cannot crop the frame: %s", sp->host->strerror(rc));
    rlai_screen_image_free(&f->img);
    f->img = crop;
    cJSON *jb = cJSON_CreateObject();
    if (jb) {
        cJSON_AddNumberToObject(jb, "x", b.x);
        cJSON_AddNumberToObject(jb, "y", b.y);
        cJSON_AddNumberToObject(jb, "width", b.w);
        cJSON_AddNumberToObject(jb, "height", b.h);
        cJSON_AddItemToObject(f->source, "crop", jb);
    }
    return 0;
}

static int cmd_capture(rlai_call *call, const cJSON *params, void *user)
{
    static const char *const keys[] = { "display", "window", "file", "image", "region", "save_to", NULL };
    screen_plugin *sp = user;
    const rlai_host_api *h = sp->host;
    char err[1024];
    if (rlai_json_check_keys(params, keys, err, sizeof err))
        return h->reply_error(call, RLAI_ERR_INVALID_ARG, "%s", err);
    bool bad = false;
    const char *save_to = rlai_json_opt_str(params, "save_to", &bad);
    if (bad || (save_to && save_to[0] != '/'))
        return h->reply_error(call, RLAI_ERR_INVALID_ARG, "\"save_to\" must be an absolute path of a new file");
    frame f;
    int rc = get_frame(sp, call, params, &f);
    if (rc || (rc = apply_region(sp, call, params, &f)) != 0) {
        frame_free(&f);
        return rc;
    }
    double t0 = now_ms();
    uint8_t *png = NULL;
    size_t png_len = 0;
    rc = rlai_screen_png_encode(&f.img, 6, &png, &png_len);
    double enc_ms = now_ms() - t0;
    if (rc) {
        frame_free(&f);
        return h->reply_error(call, rc, "PNG encoding failed: %s", h->strerror(rc));
    }
    cJSON *r = cJSON_CreateObject();
    char *b64 = NULL;
    if (!r) {
        free(png);
        frame_free(&f);
        return h->reply_error(call, RLAI_ERR_NOMEM, "out of memory");
    }
    cJSON_AddNumberToObject(r, "width", f.img.width);
    cJSON_AddNumberToObject(r, "height", f.img.height);
    cJSON_AddStringToObject(r, "format", "png");
    cJSON_AddNumberToObject(r, "bytes", (double)png_len);
    if (save_to) {
        rc = rlai_screen_write_new_file(save_to, png, png_len, err, sizeof err);
        if (rc) {
            free(png);
            frame_free(&f);
            cJSON_Delete(r);
            return h->reply_error(call, caller_code(rc), "%s", err);
        }
        cJSON_AddStringToObject(r, "path", save_to);
    } else {
        if ((png_len + 2) / 3 * 4 > RESULT_DATA_MAX) {
            free(png);
            int w = f.img.width, hh = f.img.height;
            frame_free(&f);
            cJSON_Delete(r);
            return h->reply_error(call, RLAI_ERR_TOO_LARGE,
                                  "the %dx%d PNG is %zu bytes, over the %u bytes of base64 a result can carry; capture "
                                  "a \"region\" or a \"window\", or pass \"save_to\"",
                                  w, hh, png_len, RESULT_DATA_MAX);
        }
        if ((rc = rlai_screen_b64_encode(png, png_len, &b64)) != 0) {
            free(png);
            frame_free(&f);
            cJSON_Delete(r);
            return h->reply_error(call, rc, "out of memory");
        }
        cJSON_AddStringToObject(r, "encoding", "base64");
        cJSON_AddStringToObject(r, "data", b64);
        free(b64);
    }
    free(png);
    cJSON *tm = cJSON_AddObjectToObject(r, "timings_ms");
    if (tm) {
        cJSON_AddNumberToObject(tm, "acquire", f.acquire_ms);
        cJSON_AddNumberToObject(tm, "decode", f.decode_ms);
        cJSON_AddNumberToObject(tm, "encode", enc_ms);
    }
    cJSON_AddItemToObject(r, "source", f.source);
    f.source = NULL;
    frame_free(&f);
    h->reply_json(call, r);
    return 0;
}

/* ---- screen.analyze ------------------------------------------------------ */

static const rlai_screen_profile *find_profile(const screen_plugin *sp, const char *name)
{
    for (int i = 0; i < sp->n_profiles; i++)
        if (strcmp(sp->profiles[i].name, name) == 0)
            return &sp->profiles[i];
    return NULL;
}

/* OCR of the regions and (when the profile wants it) the whole frame. */
static int read_screen(screen_plugin *sp, const rlai_screen_image *img, const rlai_screen_profile *p,
                       rlai_screen_text *regions, rlai_screen_text *full, char *err, size_t errlen)
{
    float minc = p ? p->min_confidence : 50;
    for (int i = 0; p && i < p->n_regions; i++) {
        rlai_screen_box b = rlai_screen_region_box(&p->regions[i], img->width, img->height);
        rlai_screen_image crop;
        int rc = rlai_screen_image_crop(img, b.x, b.y, b.w, b.h, &crop);
        if (rc == 0)
            rc = rlai_screen_ocr_run(sp->ocr, &crop, b.x, b.y, minc, &regions[i], err, errlen);
        rlai_screen_image_free(&crop);
        if (rc < 0)
            return rc;
    }
    if (!p || p->other_text) {
        int rc = rlai_screen_ocr_run(sp->ocr, img, 0, 0, minc, full, err, errlen);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static char *make_user_message(const char *description, const char *question)
{
    static const char head[] = "What the screen shows (text read by OCR, with positions):\n";
    static const char mid[] = "\n\nQuestion: ";
    size_t n = sizeof head + strlen(description) + sizeof mid + strlen(question) + 1;
    char *s = malloc(n);
    if (s)
        snprintf(s, n, "%s%s%s%s", head, description, mid, question);
    return s;
}

/* The engine's vision encoder as model_info describes it: the image rows
 * per image (> 0), and the model's image token text into tok; 0 when no
 * encoder (or no model) is loaded. */
static int engine_vision(screen_plugin *sp, char *tok, size_t toklen)
{
    const rlai_host_api *h = sp->host;
    cJSON *mi = NULL;
    if (!h->model_info || h->model_info(sp->self, &mi) < 0 || !mi)
        return 0;
    int n = 0;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(mi, "vision");
    const cJSON *jn = cJSON_GetObjectItemCaseSensitive(v, "n_tokens");
    const cJSON *jt = cJSON_GetObjectItemCaseSensitive(v, "image_token");
    if (cJSON_IsNumber(jn) && jn->valuedouble >= 1 && jn->valuedouble <= 65536 && cJSON_IsString(jt) &&
        jt->valuestring[0] && strlen(jt->valuestring) < toklen) {
        n = (int)jn->valuedouble;
        snprintf(tok, toklen, "%s", jt->valuestring);
    }
    cJSON_Delete(mi);
    return n;
}

static const char VISION_SYSTEM[] =
    "You are a tactical assistant for a video game player. You see the player's screen and get their "
    "question. Answer briefly and concretely, using what the screen shows; say so when it does not show enough.";

/* Appends s to the buffer with every '<' followed by a space, so text from
 * the caller can never spell a special token ("<image>", "<end_of_utterance>")
 * in the raw prompt. */
static void append_defused(char *dst, size_t cap, size_t *o, const char *s)
{
    for (; *s && *o + 3 < cap; s++) {
        dst[(*o)++] = *s;
        if (*s == '<')
            dst[(*o)++] = ' ';
    }
    dst[*o] = 0;
}

/* img as "data:image/png;base64,..." in *out (malloc'd). Returns 0 or a
 * negative code. */
static int image_data_url(const rlai_screen_image *img, char **out)
{
    static const char head[] = "data:image/png;base64,";
    uint8_t *png = NULL;
    size_t len = 0;
    char *b64 = NULL;
    *out = NULL;
    int rc = rlai_screen_png_encode(img, 1, &png, &len);
    if (rc == 0)
        rc = rlai_screen_b64_encode(png, len, &b64);
    free(png);
    if (rc < 0)
        return rc;
    size_t n = strlen(b64);
    if (!(*out = malloc(sizeof head + n))) {
        free(b64);
        return RLAI_ERR_NOMEM;
    }
    memcpy(*out, head, sizeof head - 1);
    memcpy(*out + sizeof head - 1, b64, n + 1);
    free(b64);
    return 0;
}

/* The vision path: the frame's pixels go to the engine's encoder; the raw
 * prompt is SmolVLM's (Idefics3) chat format with the image token where
 * the image's rows go:
 *   <|im_start|>System: SYSTEM<end_of_utterance>\nUser:IMAGE QUESTION<end_of_utterance>\nAssistant:
 */
/* The fields every analysis result starts with (both modes). NULL when
 * out of memory. */
static cJSON *analysis_result(const char *mode, bool dry, const char *answer, const char *question,
                              const rlai_screen_profile *prof, const char *system, const char *prompt)
{
    cJSON *r = cJSON_CreateObject();
    if (!r)
        return NULL;
    cJSON_AddStringToObject(r, "mode", mode);
    if (dry)
        cJSON_AddNullToObject(r, "answer");
    else
        cJSON_AddStringToObject(r, "answer", answer ? answer : "");
    cJSON_AddStringToObject(r, "question", question);
    if (prof)
        cJSON_AddStringToObject(r, "profile", prof->name);
    else
        cJSON_AddNullToObject(r, "profile");
    cJSON_AddStringToObject(r, "system_prompt", system);
    cJSON_AddStringToObject(r, "prompt", prompt);
    return r;
}

static int analyze_vision(screen_plugin *sp, rlai_call *call, const cJSON *params, rlai_gen_request *req,
                          const char *question, const rlai_screen_profile *prof, bool dry,
                          const char *image_token, int vision_tokens)
{
    const rlai_host_api *h = sp->host;
    frame f;
    int rc = get_frame(sp, call, params, &f);
    if (rc) {
        frame_free(&f);
        return rc;
    }
    const char *system = prof && prof->system_prompt[0] ? prof->system_prompt : VISION_SYSTEM;
    size_t cap = strlen(system) * 2 + strlen(question) * 2 + strlen(image_token) + 128;
    char *prompt = malloc(cap);
    char *url = NULL;
    cJSON *r = NULL;
    rlai_gen_result res;
    memset(&res, 0, sizeof res);
    double answer_ms = 0;
    if (!prompt) {
        rc = h->reply_error(call, RLAI_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (sp->model[0]) {
        /* a remote vision model: the frame as a PNG data URL with the
         * question (messages: no template, nothing to defuse) */
        snprintf(prompt, cap, "%s", question);
        if (!dry) {
            if ((rc = image_data_url(&f.img, &url)) < 0) {
                rc = h->reply_error(call, rc, "could not encode the frame as PNG: %s", h->strerror(rc));
                goto done;
            }
            rlai_plugin_message msgs[2] = { { "system", system }, { "user", question } };
            req->messages = msgs;
            req->n_messages = 2;
            req->image_url = url;
            req->model = sp->model;
            req->stream = true;
            double g0 = now_ms();
            rc = h->generate(call, req, sizeof *req, &res);
            answer_ms = now_ms() - g0;
            req->messages = NULL;
            req->n_messages = 0;
            if (rc < 0) {
                rc = h->reply_error(call, rc, "generation on %s failed: %s", sp->model, h->strerror(rc));
                goto done;
            }
            if (res.stop && strcmp(res.stop, "cancelled") == 0) {
                rc = 0;
                goto done;
            }
        }
        goto answered;
    }
    size_t o = (size_t)snprintf(prompt, cap, "<|im_start|>System: ");
    append_defused(prompt, cap, &o, system);
    o += (size_t)snprintf(prompt + o, cap - o, "<end_of_utterance>\nUser:%s", image_token);
    append_defused(prompt, cap, &o, question);
    snprintf(prompt + o, cap - o, "<end_of_utterance>\nAssistant:");
    if (!dry) {
        req->prompt = prompt;
        req->stream = true;
        req->image_rgb = f.img.rgb;
        req->image_width = f.img.width;
        req->image_height = f.img.height;
        double g0 = now_ms();
        rc = h->generate(call, req, sizeof *req, &res);
        answer_ms = now_ms() - g0;
        if (rc < 0) {
            rc = rc == RLAI_ERR_UNSUPPORTED
                     ? h->reply_error(call, rc, "this host cannot pass images to the engine (older host)")
                     : h->reply_error(call, rc, "generation failed: %s", h->strerror(rc));
            goto done;
        }
        if (res.stop && strcmp(res.stop, "cancelled") == 0) {
            rc = 0;
            goto done;
        }
    }
answered:
    if (!(r = analysis_result("vision", dry, res.text, question, prof, system, prompt))) {
        rc = h->reply_error(call, RLAI_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (sp->model[0])
        cJSON_AddStringToObject(r, "model", sp->model);
    else
        cJSON_AddNumberToObject(r, "image_tokens", vision_tokens);
    cJSON_AddItemToObject(r, "source", f.source);
    f.source = NULL;
    cJSON *tm = cJSON_AddObjectToObject(r, "timings_ms");
    if (tm) {
        cJSON_AddNumberToObject(tm, "acquire", f.acquire_ms);
        cJSON_AddNumberToObject(tm, "decode", f.decode_ms);
        cJSON_AddNumberToObject(tm, "answer", answer_ms);   /* the image's encoding included */
    }
    if (!dry) {
        cJSON_AddNumberToObject(r, "prompt_tokens", res.prompt_tokens);
        cJSON_AddNumberToObject(r, "gen_tokens", res.gen_tokens);
        cJSON_AddNumberToObject(r, "seed", (double)req->seed);
        cJSON_AddStringToObject(r, "stop", res.stop ? res.stop : "");
    }
    h->reply_json(call, r);
    rc = 0;
done:
    free(prompt);
    free(url);
    h->free(res.text);
    frame_free(&f);
    return rc;
}

static int cmd_analyze(rlai_call *call, const cJSON *params, void *user)
{
    static const char *const keys[] = { "question", "display", "window", "file", "image", "mode", "profile",
                                        "dry_run", "max_tokens", "temperature", "seed", NULL };
    screen_plugin *sp = user;
    const rlai_host_api *h = sp->host;
    char err[1024];
    if (rlai_json_check_keys(params, keys, err, sizeof err))
        return h->reply_error(call, RLAI_ERR_INVALID_ARG, "%s", err);
    const cJSON *jq = cJSON_GetObjectItemCaseSensitive(params, "question");
    if (!cJSON_IsString(jq) || !jq->valuestring[0])
        return h->reply_error(call, RLAI_ERR_INVALID_ARG, "\"question\" (a non-empty string) is required");
    if (strlen(jq->valuestring) > MAX_QUESTION)
        return h->reply_error(call, RLAI_ERR_TOO_LARGE, "\"question\" is %zu bytes; at most %d are accepted",
                              strlen(jq->valuestring), MAX_QUESTION);
    bool bad = false;
    const char *mode = rlai_json_opt_str(params, "mode", &bad);
    if (bad || (mode && strcmp(mode, "auto") && strcmp(mode, "ocr") && strcmp(mode, "vision")))
        return h->reply_error(call, RLAI_ERR_INVALID_ARG, "\"mode\" must be \"auto\", \"ocr\" or \"vision\"");
    char image_token[64] = "";
    bool remote = sp->model[0] != 0;
    int vision_tokens = remote ? 0 : engine_vision(sp, image_token, sizeof image_token);
    /* a remote model: "vision" sends the image; "auto" too when the
     * config says that model sees images (remote_vision) */
    bool use_vision = remote ? (mode && !strcmp(mode, "vision")) || ((!mode || !strcmp(mode, "auto")) && sp->remote_vision)
                             : vision_tokens > 0 && (!mode || strcmp(mode, "ocr") != 0);
    if (!remote && mode && strcmp(mode, "vision") == 0 && vision_tokens <= 0)
        return h->reply_error(call, RLAI_ERR_NOT_IMPLEMENTED,
                              "\"mode\": \"vision\" needs a vision encoder, and the engine has none loaded (start "
                              "rlai serve with --mmproj FILE, the model's llama.cpp mmproj GGUF); use \"mode\": "
                              "\"ocr\" or \"auto\"");
    const cJSON *jdry = cJSON_GetObjectItemCaseSensitive(params, "dry_run");
    if (jdry && !cJSON_IsBool(jdry))
        return h->reply_error(call, RLAI_ERR_INVALID_ARG, "\"dry_run\" must be true or false");
    bool dry = cJSON_IsTrue(jdry);

    rlai_gen_request req;
    memset(&req, 0, sizeof req);
    req.model = sp->model[0] ? sp->model : NULL;
    req.max_tokens = sp->max_tokens;
    req.temperature = sp->temperature;
    if (rlai_json_opt_int(params, "max_tokens", 1, 4096, &req.max_tokens, err, sizeof err))
        return h->reply_error(call, RLAI_ERR_INVALID_ARG, "%s", err);
    const cJSON *jt = cJSON_GetObjectItemCaseSensitive(params, "temperature");
    if (jt) {
        if (!cJSON_IsNumber(jt) || !(jt->valuedouble >= 0 && jt->valuedouble <= 2))
            return h->reply_error(call, RLAI_ERR_INVALID_ARG, "\"temperature\" must be a number in 0..2");
        req.temperature = (float)jt->valuedouble;
    }
    const cJSON *jseed = cJSON_GetObjectItemCaseSensitive(params, "seed");
    if (jseed) {
        if (!cJSON_IsNumber(jseed) || jseed->valuedouble < 0 || jseed->valuedouble > 9007199254740992.0 ||
            jseed->valuedouble != (double)(uint64_t)jseed->valuedouble)
            return h->reply_error(call, RLAI_ERR_INVALID_ARG, "\"seed\" must be a non-negative integer");
        req.seed = (uint64_t)jseed->valuedouble;
    } else {
        req.seed = fresh_seed();
    }

    /* the profile: a name of a loaded one, an inline object, or the default */
    rlai_screen_profile inline_p;
    memset(&inline_p, 0, sizeof inline_p);
    const rlai_screen_profile *prof = NULL;
    const cJSON *jp = cJSON_GetObjectItemCaseSensitive(params, "profile");
    if (cJSON_IsString(jp)) {
        if (!(prof = find_profile(sp, jp->valuestring))) {
            char names[512] = "";
            size_t o = 0;
            for (int i = 0; i < sp->n_profiles && o < sizeof names - 40; i++)
                o += (size_t)snprintf(names + o, sizeof names - o, "%s%s", i ? ", " : "", sp->profiles[i].name);
            return h->reply_error(call, RLAI_ERR_NOT_FOUND, "unknown profile \"%.64s\"; loaded profiles: %s",
                                  jp->valuestring, sp->n_profiles ? names : "(none)");
        }
    } else if (cJSON_IsObject(jp)) {
        int rc = rlai_screen_profile_parse(jp, &inline_p, err, sizeof err);
        if (rc)
            return h->reply_error(call, rc, "%s", err);
        prof = &inline_p;
    } else if (jp && !cJSON_IsNull(jp)) {
        return h->reply_error(call, RLAI_ERR_INVALID_ARG, "\"profile\" must be a profile name or a profile object");
    } else if (sp->default_profile[0]) {
        prof = find_profile(sp, sp->default_profile);
    }
    if (use_vision) {
        int rc = analyze_vision(sp, call, params, &req, jq->valuestring, prof, dry, image_token, vision_tokens);
        rlai_screen_profile_free(&inline_p);
        return rc;
    }
    if (!sp->ocr) {
        rlai_screen_profile_free(&inline_p);
        return h->reply_error(call, RLAI_ERR_NOT_IMPLEMENTED, "OCR is not available: %s", sp->ocr_error);
    }

    frame f;
    int rc = get_frame(sp, call, params, &f);
    if (rc) {
        frame_free(&f);
        rlai_screen_profile_free(&inline_p);
        return rc;
    }
    int n_regions = prof ? prof->n_regions : 0;
    rlai_screen_text *rtext = calloc((size_t)(n_regions ? n_regions : 1), sizeof *rtext);
    rlai_screen_text full = { 0 };
    char *desc = NULL, *umsg = NULL;
    cJSON *ocr_json = NULL, *r = NULL;
    rlai_gen_result res;
    memset(&res, 0, sizeof res);
    double t0 = now_ms(), ocr_ms = 0, answer_ms = 0;
    if (!rtext) {
        rc = h->reply_error(call, RLAI_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((rc = read_screen(sp, &f.img, prof, rtext, &full, err, sizeof err)) < 0) {
        rc = h->reply_error(call, rc, "OCR failed: %s", err);
        goto done;
    }
    ocr_ms = now_ms() - t0;
    if (h->cancelled(call)) {     /* OCR takes a while: the caller may be gone */
        rc = 0;
        goto done;
    }
    const char *system = prof && prof->system_prompt[0] ? prof->system_prompt : DEFAULT_SYSTEM;
    size_t max_chars = (size_t)sp->max_prompt_chars;
    for (int attempt = 0;; attempt++) {
        free(desc);
        free(umsg);
        cJSON_Delete(ocr_json);
        desc = umsg = NULL;
        ocr_json = NULL;
        if ((rc = rlai_screen_layout_describe(f.img.width, f.img.height, prof, rtext, &full, max_chars, &desc,
                                              &ocr_json)) != 0 ||
            !(umsg = make_user_message(desc, jq->valuestring))) {
            rc = h->reply_error(call, RLAI_ERR_NOMEM, "out of memory");
            goto done;
        }
        if (dry)
            break;
        rlai_plugin_message msgs[2] = { { "system", system }, { "user", umsg } };
        req.messages = msgs;
        req.n_messages = 2;
        req.stream = true;
        double g0 = now_ms();
        h->free(res.text);
        memset(&res, 0, sizeof res);
        rc = h->generate(call, &req, sizeof req, &res);
        answer_ms = now_ms() - g0;
        /* refused before anything streamed: a shorter description */
        if ((rc == RLAI_ERR_TOO_LARGE || rc == RLAI_ERR_CONTEXT_FULL) && attempt < 3 && max_chars > 400) {
            max_chars /= 2;
            continue;
        }
        break;
    }
    if (rc < 0) {
        if (rc == RLAI_ERR_NOT_IMPLEMENTED)
            rc = h->reply_error(call, rc, "no model is loaded: %s (start rlai serve with -m MODEL, or pass "
                                          "\"dry_run\": true for the OCR and the prompt only)",
                                h->strerror(rc));
        else
            rc = h->reply_error(call, rc, "generation failed: %s", h->strerror(rc));
        goto done;
    }
    if (!dry && res.stop && strcmp(res.stop, "cancelled") == 0) {
        rc = 0;
        goto done;
    }
    r = analysis_result("ocr", dry, res.text, jq->valuestring, prof, system, umsg);
    if (!r) {
        rc = h->reply_error(call, RLAI_ERR_NOMEM, "out of memory");
        goto done;
    }
    cJSON_AddStringToObject(r, "description", desc);
    cJSON_AddItemToObject(r, "ocr", ocr_json);
    ocr_json = NULL;
    cJSON_AddItemToObject(r, "source", f.source);
    f.source = NULL;
    cJSON *tm = cJSON_AddObjectToObject(r, "timings_ms");
    if (tm) {
        cJSON_AddNumberToObject(tm, "acquire", f.acquire_ms);
        cJSON_AddNumberToObject(tm, "decode", f.decode_ms);
        cJSON_AddNumberToObject(tm, "ocr", ocr_ms);
        cJSON_AddNumberToObject(tm, "answer", answer_ms);
    }
    if (!dry) {
        cJSON_AddNumberToObject(r, "prompt_tokens", res.prompt_tokens);
        cJSON_AddNumberToObject(r, "gen_tokens", res.gen_tokens);
        cJSON_AddNumberToObject(r, "seed", (double)req.seed);
        cJSON_AddStringToObject(r, "stop", res.stop ? res.stop : "");
    }
    h->reply_json(call, r);
    rc = 0;
done:
    for (int i = 0; rtext && i < n_regions; i++)
        rlai_screen_text_free(&rtext[i]);
    free(rtext);
    rlai_screen_text_free(&full);
    free(desc);
    free(umsg);
    cJSON_Delete(ocr_json);
    h->free(res.text);
    frame_free(&f);
    rlai_screen_profile_free(&inline_p);
    return rc;
}

/* ---- configuration ------------------------------------------------------- */

static void sp_free(screen_plugin *sp)
{
    if (!sp)
        return;
    rlai_screen_ocr_free(sp->ocr);
    for (int i = 0; i < sp->n_profiles; i++)
        rlai_screen_profile_free(&sp->profiles[i]);
    free(sp->profiles);
    free(sp);
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Loads every <dir>/NAME.json as a profile (name order). A bad profile fails
 * the load with its message. */
static int load_profile_dir(screen_plugin *sp, const char *dir, bool must_exist, char *err, size_t errlen)
{
    DIR *d = opendir(dir);
    if (!d) {
        if (!must_exist)
            return 0;
        snprintf(err, errlen, "profiles folder %.512s cannot be opened", dir);
        return RLAI_ERR_NOT_FOUND;
    }
    char *names[MAX_PROFILES + 1];
    int n = 0, rc = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len < 6 || e->d_name[0] == '.' || strcmp(e->d_name + len - 5, ".json") != 0)
            continue;
        if (n == MAX_PROFILES) {
            snprintf(err, errlen, "profiles folder %.512s holds more than %d profiles", dir, MAX_PROFILES);
            rc = RLAI_ERR_TOO_LARGE;
            break;
        }
        if (!(names[n] = malloc(len + 1))) {
            rc = RLAI_ERR_NOMEM;
            break;
        }
        memcpy(names[n++], e->d_name, len + 1);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], name_cmp);
    for (int i = 0; i < n && rc == 0; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (sp->n_profiles == MAX_PROFILES) {
            snprintf(err, errlen, "more than %d profiles", MAX_PROFILES);
            rc = RLAI_ERR_TOO_LARGE;
            break;
        }
        rlai_screen_profile p;
        if ((rc = rlai_screen_profile_load(path, &p, err, errlen)) != 0)
            break;
        if (find_profile(sp, p.name)) {
            snprintf(err, errlen, "profile %.512s: another profile is already named \"%s\"", path, p.name);
            rlai_screen_profile_free(&p);
            rc = RLAI_ERR_EXISTS;
            break;
        }
        sp->profiles[sp->n_profiles++] = p;
    }
    for (int i = 0; i < n; i++)
        free(names[i]);
    return rc;
}

static int read_config(screen_plugin *sp, const cJSON *cfg, char *err, size_t errlen)
{
    static const char *const keys[] = { "profiles", "default_profile", "max_image_bytes", "max_width", "max_height",
                                        "max_prompt_chars", "max_tokens", "temperature", "ocr_lang", "tessdata",
                                        "ocr_instances", "use_shm", "mmproj", "model", "remote_vision", NULL };
    for (const cJSON *it = cfg->child; it; it = it->next) {
        bool known = false;
        for (int i = 0; keys[i] && !known; i++)
            known = it->string && strcmp(it->string, keys[i]) == 0;
        if (!known)
            sp->host->log(sp->self, RLAI_LOG_WARN, "config: unknown key \"%s\" ignored", it->string ? it->string : "");
    }
    int mb = (int)(RLAI_SCREEN_MAX_BYTES >> 20), mw = RLAI_SCREEN_MAX_DIM, mh = RLAI_SCREEN_MAX_DIM;
    sp->max_prompt_chars = DEFAULT_PROMPT_CHARS;
    sp->max_tokens = DEFAULT_MAX_TOKENS;
    char why[256];
    int rc;
    if ((rc = rlai_json_opt_int(cfg, "max_image_bytes", 1024, 1 << 30, &mb, why, sizeof why)) != 0 ||
        (rc = rlai_json_opt_int(cfg, "max_width", 16, 16384, &mw, why, sizeof why)) != 0 ||
        (rc = rlai_json_opt_int(cfg, "max_height", 16, 16384, &mh, why, sizeof why)) != 0 ||
        (rc = rlai_json_opt_int(cfg, "max_prompt_chars", 200, 1 << 20, &sp->max_prompt_chars, why, sizeof why)) != 0 ||
        (rc = rlai_json_opt_int(cfg, "max_tokens", 1, 4096, &sp->max_tokens, why, sizeof why)) != 0) {
        snprintf(err, errlen, "config: %s", why);
        return rc;
    }
    const cJSON *mib = cJSON_GetObjectItemCaseSensitive(cfg, "max_image_bytes");
    sp->limits.max_bytes = mib ? (size_t)mb : RLAI_SCREEN_MAX_BYTES;
    sp->limits.max_width = mw;
    sp->limits.max_height = mh;
    sp->limits.max_pixels = (long long)mw * mh;
    sp->temperature = 0.2f;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(cfg, "temperature");
    if (t) {
        if (!cJSON_IsNumber(t) || !(t->valuedouble >= 0 && t->valuedouble <= 2)) {
            snprintf(err, errlen, "config: \"temperature\" must be a number in 0..2");
            return RLAI_ERR_INVALID_ARG;
        }
        sp->temperature = (float)t->valuedouble;
    }
    const cJSON *shm = cJSON_GetObjectItemCaseSensitive(cfg, "use_shm");
    if (shm && !cJSON_IsBool(shm)) {
        snprintf(err, errlen, "config: \"use_shm\" must be true or false");
        return RLAI_ERR_INVALID_ARG;
    }
    sp->no_shm = cJSON_IsFalse(shm);
    const cJSON *mm = cJSON_GetObjectItemCaseSensitive(cfg, "mmproj");
    if (mm && !cJSON_IsNull(mm)) {
        if (!cJSON_IsString(mm) || strlen(mm->valuestring) >= sizeof sp->mmproj) {
            snprintf(err, errlen, "config: \"mmproj\" must be a path (string)");
            return RLAI_ERR_INVALID_ARG;
        }
        snprintf(sp->mmproj, sizeof sp->mmproj, "%s", mm->valuestring);
    }
    const cJSON *md = cJSON_GetObjectItemCaseSensitive(cfg, "model");
    if (md && !cJSON_IsNull(md)) {
        if (!cJSON_IsString(md) || strlen(md->valuestring) >= sizeof sp->model) {
            snprintf(err, errlen, "config: \"model\" must be a model name (at most 256 bytes)");
            return RLAI_ERR_INVALID_ARG;
        }
        snprintf(sp->model, sizeof sp->model, "%s", strcmp(md->valuestring, "default") ? md->valuestring : "");
    }
    const cJSON *rv = cJSON_GetObjectItemCaseSensitive(cfg, "remote_vision");
    if (rv && !cJSON_IsBool(rv)) {
        snprintf(err, errlen, "config: \"remote_vision\" must be true or false");
        return RLAI_ERR_INVALID_ARG;
    }
    sp->remote_vision = cJSON_IsTrue(rv);
    if (sp->remote_vision && !sp->model[0]) {
        snprintf(err, errlen, "config: \"remote_vision\" needs \"model\" (a remote model)");
        return RLAI_ERR_INVALID_ARG;
    }
    const cJSON *dp = cJSON_GetObjectItemCaseSensitive(cfg, "default_profile");
    if (dp && !cJSON_IsNull(dp)) {
        if (!cJSON_IsString(dp) || !rlai_screen_profile_name_ok(dp->valuestring)) {
            snprintf(err, errlen, "config: \"default_profile\" must be a profile name");
            return RLAI_ERR_INVALID_ARG;
        }
        snprintf(sp->default_profile, sizeof sp->default_profile, "%s", dp->valuestring);
    }
    return 0;
}

static int load_profiles(screen_plugin *sp, const cJSON *cfg, char *err, size_t errlen)
{
    if (!(sp->profiles = calloc(MAX_PROFILES, sizeof *sp->profiles))) {
        snprintf(err, errlen, "out of memory");
        return RLAI_ERR_NOMEM;
    }
    const cJSON *dirs = cJSON_GetObjectItemCaseSensitive(cfg, "profiles");
    const char *base = sp->host->plugin_dir(sp->self);
    if (!dirs) { /* the shipped folder, when present */
        char p[1024];
        snprintf(p, sizeof p, "%s/profiles", base);
        return load_profile_dir(sp, p, false, err, errlen);
    }
    if (!cJSON_IsArray(dirs)) {
        snprintf(err, errlen, "config: \"profiles\" must be an array of folders");
        return RLAI_ERR_INVALID_ARG;
    }
    for (const cJSON *it = dirs->child; it; it = it->next) {
        if (!cJSON_IsString(it) || !it->valuestring[0]) {
            snprintf(err, errlen, "config: \"profiles\": every item must be a non-empty path");
            return RLAI_ERR_INVALID_ARG;
        }
        char p[1024];
        if (it->valuestring[0] == '/')
            snprintf(p, sizeof p, "%s", it->valuestring);
        else
            snprintf(p, sizeof p, "%s/%s", base, it->valuestring);
        int rc = load_profile_dir(sp, p, true, err, errlen);
        if (rc)
            return rc;
    }
    return 0;
}

/* ---- entry points --------------------------------------------------------- */

#define SOURCE_PROPS                                                                                              \
    "\"file\":{\"type\":\"string\",\"description\":\"Absolute path of a PNG or JPEG screenshot to read.\"},"      \
    "\"image\":{\"type\":\"string\",\"contentEncoding\":\"base64\",\"description\":\"PNG or JPEG bytes, "        \
    "base64 (a data: URL is accepted).\"},"                                                                        \
    "\"window\":{\"type\":\"string\",\"description\":\"Title of the game window to capture (exact, or a "         \
    "unique part of it); see screen.sources.\"},"                                                                  \
    "\"display\":{\"type\":\"string\",\"description\":\"X11 display to capture, e.g. \\\":0\\\" (default: "      \
    "the engine's DISPLAY).\"}"

static const char ANALYZE_SCHEMA[] =
    "{\"type\":\"object\",\"properties\":{"
    "\"question\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":2000,\"description\":\"What the player "
    "asks about the screen, e.g. \\\"what should I do in this fight?\\\"\"}," SOURCE_PROPS ","
    "\"mode\":{\"type\":\"string\",\"enum\":[\"auto\",\"ocr\",\"vision\"],\"default\":\"auto\",\"description\":"
    "\"ocr: read the screen's text and ask the language model; vision: show the screen to a vision-language "
    "model (needs rlai serve --mmproj, or a remote model configured); auto: vision when the engine has a "
    "vision encoder (or the configured remote model sees images), else ocr.\"},"
    "\"profile\":{\"description\":\"Game profile (regions of interest and a system prompt): the name of a "
    "loaded profile, or a profile object.\",\"oneOf\":[{\"type\":\"string\"},{\"type\":\"object\"}]},"
    "\"dry_run\":{\"type\":\"boolean\",\"default\":false,\"description\":\"Only read the screen and build the "
    "prompt; no answer is generated.\"},"
    "\"max_tokens\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":4096},"
    "\"temperature\":{\"type\":\"number\",\"minimum\":0,\"maximum\":2},"
    "\"seed\":{\"type\":\"integer\",\"minimum\":0}},"
    "\"required\":[\"question\"],\"additionalProperties\":false}";

static const char CAPTURE_SCHEMA[] =
    "{\"type\":\"object\",\"properties\":{" SOURCE_PROPS ","
    "\"region\":{\"type\":\"array\",\"items\":{\"type\":\"number\",\"minimum\":0,\"maximum\":1},\"minItems\":4,"
    "\"maxItems\":4,\"description\":\"Crop [x, y, width, height] as fractions of the frame.\"},"
    "\"save_to\":{\"type\":\"string\",\"description\":\"Absolute path of a new file to write the PNG to "
    "(instead of returning it).\"}},"
    "\"additionalProperties\":false}";

static const char SOURCES_SCHEMA[] =
    "{\"type\":\"object\",\"properties\":{\"display\":{\"type\":\"string\",\"description\":\"X11 display, "
    "e.g. \\\":0\\\" (default: the engine's DISPLAY).\"}},\"additionalProperties\":false}";

RLAI_PLUGIN_EXPORT int rlai_plugin_init(const rlai_host_api *host, rlai_plugin *self, char **errmsg)
{
    char err[1024] = "";
    screen_plugin *sp = calloc(1, sizeof *sp);
    if (!sp) {
        if (errmsg)
            *errmsg = host_strdup(host, "out of memory");
        return RLAI_ERR_NOMEM;
    }
    sp->host = host;
    sp->self = self;
    const cJSON *cfg = host->config(self);
    int rc = read_config(sp, cfg, err, sizeof err);
    if (rc == 0)
        rc = load_profiles(sp, cfg, err, sizeof err);
    if (rc == 0 && sp->default_profile[0] && !find_profile(sp, sp->default_profile)) {
        snprintf(err, sizeof err, "config: default_profile \"%s\" is not a loaded profile", sp->default_profile);
        rc = RLAI_ERR_NOT_FOUND;
    }
    if (rc == 0) {
        /* Tesseract's OpenMP threads would fight the engine's for the
         * cores: one each, unless the operator chose otherwise. Set here, on
         * the main thread, before the first Tesseract instance exists. */
        setenv("OMP_THREAD_LIMIT", "1", 0);
        const cJSON *lang = cJSON_GetObjectItemCaseSensitive(cfg, "ocr_lang");
        const cJSON *data = cJSON_GetObjectItemCaseSensitive(cfg, "tessdata");
        int inst = 2;
        char why[256];
        if (rlai_json_opt_int(cfg, "ocr_instances", 1, 64, &inst, why, sizeof why) ||
            (lang && !cJSON_IsString(lang)) || (data && !cJSON_IsString(data))) {
            snprintf(err, sizeof err, "config: \"ocr_lang\" and \"tessdata\" must be strings, \"ocr_instances\" "
                                      "an integer in 1..64");
            rc = RLAI_ERR_INVALID_ARG;
        } else {
            int orc = rlai_screen_ocr_new(data ? data->valuestring : NULL, lang ? lang->valuestring : NULL, inst,
                                          &sp->ocr, sp->ocr_error, sizeof sp->ocr_error);
            if (orc)
                host->log(self, RLAI_LOG_WARN, "OCR unavailable, screen.analyze will refuse: %s", sp->ocr_error);
        }
    }
    if (rc == 0) {
        const rlai_command_desc cmds[] = {
            { .name = "screen.analyze",
              .description =
                  "Look at the player's screen and answer a question about it (\"what should I do in this "
                  "fight?\"). Reads the game window, the whole screen, or a given screenshot; the text on it "
                  "(health, ammo, quest and dialogue text) is read by OCR, laid out by position and by the game "
                  "profile's regions, and the model's answer is streamed. The result has the answer, the text "
                  "read and the prompt used.",
              .params_schema = ANALYZE_SCHEMA, .handler = cmd_analyze, .user = sp, .flags = RLAI_CMD_STREAMS },
            { .name = "screen.capture",
              .description = "Capture the screen, a window (by title) or a region of it as a PNG image, returned "
                             "base64-encoded (or written to a new file with save_to).",
              .params_schema = CAPTURE_SCHEMA, .handler = cmd_capture, .user = sp },
            { .name = "screen.sources",
              .description = "List what screen.capture and screen.analyze can read: the display's screen size and "
                             "the titled windows on it.",
              .params_schema = SOURCES_SCHEMA, .handler = cmd_sources, .user = sp },
        };
        for (size_t i = 0; rc == 0 && i < sizeof cmds / sizeof cmds[0]; i++)
            if ((rc = host->register_command(self, &cmds[i], sizeof cmds[i])) != 0)
                snprintf(err, sizeof err, "cannot register %s: %s", cmds[i].name, host->strerror(rc));
    }
    if (rc != 0) {
        if (errmsg)
            *errmsg = host_strdup(host, err[0] ? err : host->strerror(rc));
        sp_free(sp);
        return rc;
    }
    if (sp->mmproj[0])
        host->log(self, RLAI_LOG_WARN, "config \"mmproj\" is not used by the plugin: the engine loads the vision "
                                       "projector (rlai serve --mmproj FILE, or the daemon config's "
                                       "\"vision\": {\"mmproj\": FILE}); \"auto\" picks vision when it has one");
    host->log(self, RLAI_LOG_INFO, "%d profile(s), OCR %s", sp->n_profiles, sp->ocr ? "ready" : "unavailable");
    host->set_state(self, sp);
    return 0;
}

RLAI_PLUGIN_EXPORT void rlai_plugin_fini(void *state)
{
    sp_free(state);
}
