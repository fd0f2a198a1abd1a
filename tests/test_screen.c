/* test_screen.c - the screen plugin's objects without a host: PNG/JPEG
 * decoding and its limits, PNG encoding, base64, crops, profiles and the
 * layout description (plugins/screen/). OCR and capture are tested against
 * a real X server in tests/integration/test_screen.py. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

#include <rlai/error.h>

#include "base64.h"
#include "image.h"
#include "imgdecode.h"
#include "layout.h"
#include "pngenc.h"
#include "profile.h"

static void fill_pattern(rlai_screen_image *img)
{
    for (int y = 0; y < img->height; y++)
        for (int x = 0; x < img->width; x++) {
            uint8_t *p = img->rgb + ((size_t)y * (size_t)img->width + (size_t)x) * 3;
            p[0] = (uint8_t)(x * 7 + y);
            p[1] = (uint8_t)(y * 13);
            p[2] = (uint8_t)((x ^ y) * 3);
        }
}

static void make_png(int w, int h, rlai_screen_image *img, uint8_t **png, size_t *len)
{
    ck_assert_int_eq(rlai_screen_image_alloc(img, w, h), 0);
    fill_pattern(img);
    ck_assert_int_eq(rlai_screen_png_encode(img, 6, png, len), 0);
}

/* A smooth image as JPEG (quality 95) made with libjpeg. */
static void make_jpeg(int w, int h, rlai_screen_image *img, uint8_t **out, size_t *len)
{
    ck_assert_int_eq(rlai_screen_image_alloc(img, w, h), 0);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            uint8_t *p = img->rgb + ((size_t)y * (size_t)w + (size_t)x) * 3;
            p[0] = (uint8_t)(x * 255 / w);
            p[1] = (uint8_t)(y * 255 / h);
            p[2] = 128;
        }
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr e;
    c.err = jpeg_std_error(&e);
    jpeg_create_compress(&c);
    unsigned char *buf = NULL;
    unsigned long n = 0;
    jpeg_mem_dest(&c, &buf, &n);
    c.image_width = (JDIMENSION)w;
    c.image_height = (JDIMENSION)h;
    c.input_components = 3;
    c.in_color_space = JCS_RGB;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, 95, TRUE);
    jpeg_start_compress(&c, TRUE);
    while (c.next_scanline < c.image_height) {
        JSAMPROW row = img->rgb + (size_t)c.next_scanline * (size_t)w * 3;
        jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    *out = buf;
    *len = n;
}

START_TEST(png_round_trip)
{
    rlai_screen_image src, dst;
    uint8_t *png;
    size_t len;
    make_png(97, 41, &src, &png, &len);
    ck_assert_str_eq(rlai_screen_image_format(png, len), "png");
    char err[256];
    ck_assert_int_eq(rlai_screen_decode(png, len, NULL, &dst, err, sizeof err), 0);
    ck_assert_int_eq(dst.width, 97);
    ck_assert_int_eq(dst.height, 41);
    ck_assert_mem_eq(dst.rgb, src.rgb, 97 * 41 * 3);
    free(png);
    rlai_screen_image_free(&src);
    rlai_screen_image_free(&dst);
}
END_TEST

START_TEST(jpeg_decodes_close)
{
    rlai_screen_image src, dst;
    uint8_t *jpg;
    size_t len;
    make_jpeg(64, 48, &src, &jpg, &len);
    ck_assert_str_eq(rlai_screen_image_format(jpg, len), "jpeg");
    char err[256];
    ck_assert_int_eq(rlai_screen_decode(jpg, len, NULL, &dst, err, sizeof err), 0);
    ck_assert_int_eq(dst.width, 64);
    ck_assert_int_eq(dst.height, 48);
    int maxdiff = 0;
    for (size_t i = 0; i < 64 * 48 * 3; i++) {
        int d = abs((int)dst.rgb[i] - (int)src.rgb[i]);
        maxdiff = d > maxdiff ? d : maxdiff;
    }
    ck_assert_int_le(maxdiff, 16);
    /* truncated: refused, not grey-filled */
    rlai_screen_image t;
    for (size_t cut = 3; cut < len; cut += len / 7) {
        int rc = rlai_screen_decode(jpg, cut, NULL, &t, err, sizeof err);
        ck_assert_int_eq(rc, RLAI_ERR_FORMAT);
        ck_assert_ptr_null(t.rgb);
        ck_assert(strstr(err, "JPEG") != NULL);
    }
    free(jpg);
    rlai_screen_image_free(&src);
    rlai_screen_image_free(&dst);
}
END_TEST

START_TEST(png_truncated_and_corrupt)
{
    rlai_screen_image src, t;
    uint8_t *png;
    size_t len;
    char err[256];
    make_png(50, 50, &src, &png, &len);
    for (size_t cut = 8; cut < len; cut += 37) {
        ck_assert_int_eq(rlai_screen_decode(png, cut, NULL, &t, err, sizeof err), RLAI_ERR_FORMAT);
        ck_assert_ptr_null(t.rgb);
    }
    /* a flipped byte in the pixel data: CRC or zlib error */
    png[len / 2] ^= 0x5A;
    ck_assert_int_eq(rlai_screen_decode(png, len, NULL, &t, err, sizeof err), RLAI_ERR_FORMAT);
    ck_assert(strstr(err, "PNG") != NULL);
    free(png);
    rlai_screen_image_free(&src);
    /* fuzz_screen_decode's find: a 2x2 palette PNG whose sPLT chunk claims
     * 0x73737373 bytes; libpng allocated all 1.9 GB before reading it */
    static const uint8_t bomb[] = {
        0x89, 'P', 'N', 'G', 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 0x0d, 'I', 'H', 'D', 'R', 0, 0, 0, 2, 0, 0, 0, 2, 8, 3,
        0, 0, 0, 0x45, 0x68, 0xfd, 0x16, 0, 0, 0, 6, 's', 's', 's', 's', 's', 's', 's', 's', 's', 's', 's', 's', 's',
        's', 's', 's', 's', 's', 's', 'P', 'L', 'T', 'E', 0xff, 0, 0, 0, 0xff, 0, 0xd2, 0x87, 0xef, 0x71, 0, 0, 0, 1,
        't', 'R', 'N', 'S', 0x80, 0xad, 0x5e, 0x5b, 0x46, 0, 0, 0, 0x0c, 'I', 'D', 'A', 'T', 0x78, 0x9c, 0x63, 0x60,
        0x60, 0x04, 0x42, 0, 0, 0x0c, 0, 0x03, 0x2b, 0x63, 0xcb, 0x50, 0, 0, 0, 0, 'I', 'E', 'N', 'D', 0xae, 0x42,
        0x60, 0x82,
    };
    ck_assert_int_eq(rlai_screen_decode(bomb, sizeof bomb, NULL, &t, err, sizeof err), RLAI_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(err, "runs past the end"));
    ck_assert_ptr_null(t.rgb);
}
END_TEST

START_TEST(limits)
{
    rlai_screen_image src, t;
    uint8_t *png;
    size_t len;
    char err[256];
    /* wider than the default 8192: refused from the header */
    make_png(9000, 2, &src, &png, &len);
    ck_assert_int_eq(rlai_screen_decode(png, len, NULL, &t, err, sizeof err), RLAI_ERR_TOO_LARGE);
    ck_assert(strstr(err, "9000x2") != NULL);
    free(png);
    rlai_screen_image_free(&src);
    make_png(200, 10, &src, &png, &len);
    rlai_screen_limits l = { .max_width = 100 };
    ck_assert_int_eq(rlai_screen_decode(png, len, &l, &t, err, sizeof err), RLAI_ERR_TOO_LARGE);
    l = (rlai_screen_limits){ .max_pixels = 1999 };
    ck_assert_int_eq(rlai_screen_decode(png, len, &l, &t, err, sizeof err), RLAI_ERR_TOO_LARGE);
    l = (rlai_screen_limits){ .max_bytes = len - 1 };
    ck_assert_int_eq(rlai_screen_decode(png, len, &l, &t, err, sizeof err), RLAI_ERR_TOO_LARGE);
    l = (rlai_screen_limits){ .max_pixels = 2000, .max_bytes = len };
    ck_assert_int_eq(rlai_screen_decode(png, len, &l, &t, err, sizeof err), 0);
    rlai_screen_image_free(&t);
    free(png);
    rlai_screen_image_free(&src);
    /* JPEG header dimensions too */
    uint8_t *jpg;
    make_jpeg(300, 20, &src, &jpg, &len);
    l = (rlai_screen_limits){ .max_width = 299 };
    ck_assert_int_eq(rlai_screen_decode(jpg, len, &l, &t, err, sizeof err), RLAI_ERR_TOO_LARGE);
    free(jpg);
    rlai_screen_image_free(&src);
}
END_TEST

START_TEST(not_images)
{
    rlai_screen_image t;
    char err[256];
    ck_assert_int_eq(rlai_screen_decode((const uint8_t *)"", 0, NULL, &t, err, sizeof err), RLAI_ERR_FORMAT);
    ck_assert_int_eq(rlai_screen_decode((const uint8_t *)"GIF89a....", 10, NULL, &t, err, sizeof err),
                     RLAI_ERR_FORMAT);
    ck_assert(strstr(err, "PNG or JPEG") != NULL);
    static const uint8_t sig_only[8] = { 0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n' };
    ck_assert_int_eq(rlai_screen_decode(sig_only, 8, NULL, &t, err, sizeof err), RLAI_ERR_FORMAT);
    static const uint8_t soi[4] = { 0xFF, 0xD8, 0xFF, 0xD9 };
    ck_assert_int_eq(rlai_screen_decode(soi, 4, NULL, &t, err, sizeof err), RLAI_ERR_FORMAT);
    uint8_t *buf;
    size_t len;
    ck_assert_int_eq(rlai_screen_read_file("/nonexistent/x.png", NULL, &buf, &len, err, sizeof err),
                     RLAI_ERR_NOT_FOUND);
    ck_assert_int_eq(rlai_screen_read_file("/", NULL, &buf, &len, err, sizeof err), RLAI_ERR_IO);
}
END_TEST

START_TEST(crop_clips)
{
    rlai_screen_image src, c;
    ck_assert_int_eq(rlai_screen_image_alloc(&src, 10, 8), 0);
    fill_pattern(&src);
    ck_assert_int_eq(rlai_screen_image_crop(&src, 6, 5, 10, 10, &c), 0);
    ck_assert_int_eq(c.width, 4);
    ck_assert_int_eq(c.height, 3);
    ck_assert_mem_eq(c.rgb, src.rgb + (5 * 10 + 6) * 3, 4 * 3);
    rlai_screen_image_free(&c);
    ck_assert_int_eq(rlai_screen_image_crop(&src, 10, 0, 5, 5, &c), RLAI_ERR_INVALID_ARG);
    ck_assert_int_eq(rlai_screen_image_crop(&src, 0, 0, 0, 5, &c), RLAI_ERR_INVALID_ARG);
    rlai_screen_image_free(&src);
}
END_TEST

START_TEST(base64)
{
    uint8_t data[64];
    for (int i = 0; i < 64; i++)
        data[i] = (uint8_t)(i * 37 + 11);
    for (size_t n = 0; n <= 10; n++) {
        char *s;
        ck_assert_int_eq(rlai_screen_b64_encode(data, n, &s), 0);
        ck_assert_uint_eq(strlen(s), (n + 2) / 3 * 4);
        uint8_t *back;
        size_t len;
        ck_assert_int_eq(rlai_screen_b64_decode(s, strlen(s), 0, &back, &len), 0);
        ck_assert_uint_eq(len, n);
        if (n)
            ck_assert_mem_eq(back, data, n);
        free(back);
        free(s);
    }
    char *s;
    ck_assert_int_eq(rlai_screen_b64_encode((const uint8_t *)"Man", 3, &s), 0);
    ck_assert_str_eq(s, "TWFu");
    free(s);
    uint8_t *b;
    size_t len;
    ck_assert_int_eq(rlai_screen_b64_decode("TW Fu\nTWE=", 10, 0, &b, &len), 0);
    ck_assert_uint_eq(len, 5);
    ck_assert_mem_eq(b, "ManMa", 5);
    free(b);
    const char *url = "data:image/png;base64,TWFu";
    ck_assert_int_eq(rlai_screen_b64_decode(url, strlen(url), 0, &b, &len), 0);
    ck_assert_uint_eq(len, 3);
    free(b);
    ck_assert_int_eq(rlai_screen_b64_decode("TW*u", 4, 0, &b, &len), RLAI_ERR_FORMAT);
    ck_assert_int_eq(rlai_screen_b64_decode("TWFuT", 5, 0, &b, &len), RLAI_ERR_FORMAT);
    ck_assert_int_eq(rlai_screen_b64_decode("TW=u", 4, 0, &b, &len), RLAI_ERR_FORMAT);
    ck_assert_int_eq(rlai_screen_b64_decode("TWE===", 6, 0, &b, &len), RLAI_ERR_FORMAT);
    ck_assert_int_eq(rlai_screen_b64_decode("data:text/plain,abc", 19, 0, &b, &len), RLAI_ERR_FORMAT);
    ck_assert_int_eq(rlai_screen_b64_decode("TWFuTWFu", 8, 5, &b, &len), RLAI_ERR_TOO_LARGE);
    ck_assert_int_eq(rlai_screen_b64_decode("TWFuTWFu", 8, 6, &b, &len), 0);
    free(b);
}
END_TEST

static int parse_text(const char *json, rlai_screen_profile *p, char *err, size_t errlen)
{
    cJSON *j = cJSON_Parse(json);
    ck_assert_ptr_nonnull(j);
    int rc = rlai_screen_profile_parse(j, p, err, errlen);
    cJSON_Delete(j);
    return rc;
}

START_TEST(sample_profile_loads)
{
    rlai_screen_profile p;
    char err[512];
    int rc = rlai_screen_profile_load(RLAI_SOURCE_DIR "/plugins/screen/profiles/sample_rpg.json", &p, err, sizeof err);
    ck_assert_msg(rc == 0, "%s", err);
    ck_assert_str_eq(p.name, "sample_rpg");
    ck_assert_int_ge(p.n_regions, 3);
    ck_assert_str_eq(p.regions[0].name, "health");
    ck_assert(p.regions[0].numbers);
    ck_assert(strlen(p.system_prompt) > 40);
    rlai_screen_box b = rlai_screen_region_box(&p.regions[0], 1920, 1080);
    ck_assert_int_eq(b.x, 0);
    ck_assert_int_eq(b.y, 0);
    ck_assert_int_eq(b.w, 653);    /* ceil(0.34 * 1920) */
    ck_assert_int_eq(b.h, 130);    /* ceil(0.12 * 1080) */
    rlai_screen_profile_free(&p);
    ck_assert_int_eq(rlai_screen_profile_load("/nonexistent.json", &p, err, sizeof err), RLAI_ERR_NOT_FOUND);
}
END_TEST

START_TEST(profile_refusals)
{
    static const struct {
        const char *json, *msg;
    } bad[] = {
        { "[]", "must be a JSON object" },
        { "{}", "\"name\" is required" },
        { "{\"name\":\"Bad Name\"}", "\"name\" is required" },
        { "{\"name\":\"a\",\"colour\":1}", "unknown key \"colour\"" },
        { "{\"name\":\"a\",\"min_confidence\":101}", "min_confidence" },
        { "{\"name\":\"a\",\"other_text\":1}", "other_text" },
        { "{\"name\":\"a\",\"regions\":{}}", "\"regions\" must be an array" },
        { "{\"name\":\"a\",\"regions\":[{\"name\":\"hp\"}]}", "\"rect\" must be" },
        { "{\"name\":\"a\",\"regions\":[{\"name\":\"hp\",\"rect\":[0,0,1]}]}", "\"rect\" must be" },
        { "{\"name\":\"a\",\"regions\":[{\"name\":\"hp\",\"rect\":[0.5,0,0.6,0.1]}]}", "inside the screen" },
        { "{\"name\":\"a\",\"regions\":[{\"name\":\"hp\",\"rect\":[0,0,0,0.1]}]}", "positive size" },
        { "{\"name\":\"a\",\"regions\":[{\"name\":\"hp\",\"rect\":[0,0,0.1,0.1],\"kind\":\"bar\"}]}", "\"kind\"" },
        { "{\"name\":\"a\",\"regions\":[{\"name\":\"hp\",\"rect\":[0,0,0.1,0.1],\"x\":1}]}", "unknown key \"x\"" },
        { "{\"name\":\"a\",\"regions\":[{\"name\":\"hp\",\"rect\":[0,0,0.1,0.1]},"
          "{\"name\":\"hp\",\"rect\":[0,0,0.2,0.2]}]}", "two regions are named \"hp\"" },
        { "{\"name\":\"a\",\"regions\":[{\"name\":\"HP!\",\"rect\":[0,0,0.1,0.1]}]}", "regions[0].name" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rlai_screen_profile p;
        char err[512] = "";
        ck_assert_int_eq(parse_text(bad[i].json, &p, err, sizeof err), RLAI_ERR_INVALID_ARG);
        ck_assert_msg(strstr(err, bad[i].msg) != NULL, "%s: got \"%s\"", bad[i].json, err);
    }
    rlai_screen_profile p;
    char err[512];
    ck_assert_int_eq(parse_text("{\"name\":\"ok-1\",\"regions\":[{\"name\":\"hp\",\"rect\":[0.9,0.9,0.1,0.1]}]}",
                                &p, err, sizeof err), 0);
    ck_assert_str_eq(p.regions[0].label, "hp");
    ck_assert_float_eq(p.min_confidence, 50);
    ck_assert(p.other_text);
    rlai_screen_profile_free(&p);
}
END_TEST

START_TEST(numbers_and_where)
{
    double v[8];
    ck_assert_int_eq(rlai_screen_numbers("HP 87/100", v, 8), 2);
    ck_assert(v[0] == 87 && v[1] == 100);
    ck_assert_int_eq(rlai_screen_numbers("temp -5 x-3 1.5%", v, 8), 3);
    ck_assert(v[0] == -5 && v[1] == 3 && v[2] == 1.5);
    ck_assert_int_eq(rlai_screen_numbers("no digits", v, 8), 0);
    ck_assert_int_eq(rlai_screen_numbers("1 2 3", v, 2), 3);
    ck_assert_str_eq(rlai_screen_where((rlai_screen_box){ 0, 0, 10, 10 }, 300, 300), "top-left");
    ck_assert_str_eq(rlai_screen_where((rlai_screen_box){ 140, 140, 20, 20 }, 300, 300), "center");
    ck_assert_str_eq(rlai_screen_where((rlai_screen_box){ 250, 280, 40, 10 }, 300, 300), "bottom-right");
}
END_TEST

static rlai_screen_line mk_line(const char *text, int x, int y, int w, int h)
{
    rlai_screen_line l = { 0 };
    l.text = strdup(text);
    l.box = (rlai_screen_box){ x, y, w, h };
    l.conf = 90;
    return l;
}

/* (rlai_screen_text_free lives in ocr.c, which needs Tesseract) */
static void free_text(rlai_screen_text *t)
{
    for (int i = 0; i < t->n_lines; i++)
        free(t->lines[i].text);
    free(t->lines);
}

START_TEST(layout_describes_regions_and_rest)
{
    rlai_screen_profile p;
    char err[512];
    ck_assert_int_eq(parse_text("{\"name\":\"t\",\"regions\":[{\"name\":\"health\",\"label\":\"Health\","
                                "\"rect\":[0,0,0.5,0.2],\"kind\":\"numbers\"},{\"name\":\"map\",\"rect\":[0.8,0.8,0.2,0.2]}]}",
                                &p, err, sizeof err), 0);
    rlai_screen_text regions[2] = { 0 };
    regions[0].lines = calloc(1, sizeof(rlai_screen_line));
    regions[0].lines[0] = mk_line("HP 87/100", 10, 10, 80, 20);
    regions[0].n_lines = 1;
    rlai_screen_text full = { 0 };
    full.lines = calloc(3, sizeof(rlai_screen_line));
    full.lines[0] = mk_line("HP 87/100", 10, 10, 80, 20);          /* inside health: left out */
    full.lines[1] = mk_line("Three archers guard the bridge", 300, 500, 200, 20);
    full.lines[2] = mk_line("QUEST: Cross the river", 700, 20, 90, 20);
    full.n_lines = 3;
    char *text;
    cJSON *json;
    ck_assert_int_eq(rlai_screen_layout_describe(800, 600, &p, regions, &full, 0, &text, &json), 0);
    ck_assert_msg(strstr(text, "Screen 800x600.") == text, "%s", text);
    ck_assert_msg(strstr(text, "Health (health): \"HP 87/100\"; numbers: 87, 100") != NULL, "%s", text);
    ck_assert_msg(strstr(text, "map (map): no text read") != NULL, "%s", text);
    ck_assert_msg(strstr(text, "- bottom-center: \"Three archers guard the bridge\"") != NULL, "%s", text);
    ck_assert_msg(strstr(text, "- top-right: \"QUEST: Cross the river\"") != NULL, "%s", text);
    ck_assert_ptr_null(strstr(strstr(text, "Other text") ? strstr(text, "Other text") : text, "HP 87"));
    const cJSON *h = cJSON_GetObjectItem(cJSON_GetObjectItem(json, "regions"), "health");
    ck_assert_str_eq(cJSON_GetObjectItem(h, "text")->valuestring, "HP 87/100");
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(h, "numbers")), 2);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(json, "lines")), 2);
    ck_assert(cJSON_IsFalse(cJSON_GetObjectItem(json, "truncated")));
    free(text);
    cJSON_Delete(json);
    /* a small budget: whole lines are cut and the cut is said */
    ck_assert_int_eq(rlai_screen_layout_describe(800, 600, &p, regions, &full, 120, &text, &json), 0);
    ck_assert_msg(strstr(text, "left out") != NULL, "%s", text);
    ck_assert_ptr_null(strstr(text, "QUEST"));
    ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(json, "truncated")));
    free(text);
    cJSON_Delete(json);
    /* no profile, no text */
    rlai_screen_text none = { 0 };
    ck_assert_int_eq(rlai_screen_layout_describe(640, 480, NULL, NULL, &none, 0, &text, NULL), 0);
    ck_assert_str_eq(text, "Screen 640x480.\nNo text was read on the screen.");
    free(text);
    free_text(&regions[0]);
    free_text(&full);
    rlai_screen_profile_free(&p);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("screen");
    TCase *tc = tcase_create("screen");
    tcase_add_test(tc, png_round_trip);
    tcase_add_test(tc, jpeg_decodes_close);
    tcase_add_test(tc, png_truncated_and_corrupt);
    tcase_add_test(tc, limits);
    tcase_add_test(tc, not_images);
    tcase_add_test(tc, crop_clips);
    tcase_add_test(tc, base64);
    tcase_add_test(tc, sample_profile_loads);
    tcase_add_test(tc, profile_refusals);
    tcase_add_test(tc, numbers_and_where);
    tcase_add_test(tc, layout_describes_regions_and_rest);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
