/* test_textstream.c - unit tests for engine/textstream.c */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rlai/engine.h"
#include "textstream.h"

#define FFFD "\xEF\xBF\xBD"

/* Growable collector of everything released. */
typedef struct acc {
    char buf[8192];
    size_t len;
} acc;

static bool utf8_valid(const char *s, size_t n);

static bool push(rlai_textstream *ts, acc *a, const char *bytes, size_t len)
{
    const char *o = NULL;
    size_t ol = 12345;
    bool stop = rlai_textstream_push(ts, bytes, len, &o, &ol);
    ck_assert_ptr_nonnull(o);
    ck_assert(utf8_valid(o, ol));
    ck_assert_uint_le(a->len + ol, sizeof(a->buf));
    memcpy(a->buf + a->len, o, ol);
    a->len += ol;
    return stop;
}

static bool push_s(rlai_textstream *ts, acc *a, const char *s)
{
    return push(ts, a, s, strlen(s));
}

static void flush(rlai_textstream *ts, acc *a)
{
    const char *o = NULL;
    size_t ol = 12345;
    rlai_textstream_flush(ts, &o, &ol);
    ck_assert_ptr_nonnull(o);
    ck_assert(utf8_valid(o, ol));
    memcpy(a->buf + a->len, o, ol);
    a->len += ol;
}

#define ACC_EQ(a, s)                                                                         \
    do {                                                                                     \
        ck_assert_uint_eq((a).len, strlen(s));                                               \
        ck_assert(memcmp((a).buf, (s), (a).len) == 0);                                       \
    } while (0)

static rlai_textstream *mk(const char *const *stops)
{
    rlai_textstream *ts = NULL;
    ck_assert_int_eq(rlai_textstream_new(stops, &ts), RLAI_OK);
    ck_assert_ptr_nonnull(ts);
    return ts;
}

/* Strict UTF-8 check (no overlongs, surrogates or > U+10FFFF). */
static bool utf8_valid(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned c = p[i];
        int k;
        uint32_t cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            k = 1;
            cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            k = 2;
            cp = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            k = 3;
            cp = c & 0x07;
        } else {
            return false;
        }
        if (n - i < (size_t)k + 1)
            return false;
        for (int j = 1; j <= k; j++) {
            if ((p[i + j] & 0xC0) != 0x80)
                return false;
            cp = (cp << 6) | (p[i + j] & 0x3F);
        }
        static const uint32_t min_cp[4] = {0, 0x80, 0x800, 0x10000};
        if (cp < min_cp[k] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
        i += (size_t)k + 1;
    }
    return true;
}

START_TEST(test_validator)
{
    /* the test's own UTF-8 checker */
    ck_assert(utf8_valid("a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80", 10));
    ck_assert(!utf8_valid("\xF0\x9F\x98", 3));
    ck_assert(!utf8_valid("\xED\xA0\x80", 3));
    ck_assert(!utf8_valid("\xC0\x80", 2));
    ck_assert(!utf8_valid("\xF4\x90\x80\x80", 4));
    ck_assert(!utf8_valid("\x80", 1));
    ck_assert(!utf8_valid("\xC3", 1));
}
END_TEST

START_TEST(test_create)
{
    rlai_textstream *ts = (rlai_textstream *)1;
    ck_assert_int_eq(rlai_textstream_new(NULL, NULL), RLAI_ERR_INVALID_ARG);
    ts = mk(NULL);
    acc a = {0};
    ck_assert(!push_s(ts, &a, "plain text"));
    ck_assert(!push(ts, &a, NULL, 0));
    flush(ts, &a);
    ACC_EQ(a, "plain text");
    rlai_textstream_free(ts);
    rlai_textstream_free(NULL);
    /* empty stop strings are ignored */
    const char *stops[] = {"", "STOP", NULL};
    ts = mk(stops);
    a.len = 0;
    ck_assert(!push_s(ts, &a, "ab"));
    ck_assert(push_s(ts, &a, "cSTOPd"));
    ACC_EQ(a, "abc");
    rlai_textstream_free(ts);
}
END_TEST

START_TEST(test_emoji_split)
{
    const char emoji[] = "\xF0\x9F\x98\x80"; /* U+1F600 */
    rlai_textstream *ts = mk(NULL);
    acc a = {0};
    ck_assert(!push(ts, &a, "a\xF0", 2));
    ACC_EQ(a, "a");
    ck_assert(!push(ts, &a, emoji + 1, 1));
    ck_assert(!push(ts, &a, emoji + 2, 1));
    ACC_EQ(a, "a");
    ck_assert(!push(ts, &a, emoji + 3, 1));
    ACC_EQ(a, "a\xF0\x9F\x98\x80");
    flush(ts, &a);
    ACC_EQ(a, "a\xF0\x9F\x98\x80");
    rlai_textstream_free(ts);
}
END_TEST

START_TEST(test_stop_split)
{
    const char *stops[] = {"<|end|>", NULL};
    rlai_textstream *ts = mk(stops);
    acc a = {0};
    ck_assert(!push_s(ts, &a, "Hello <|e"));
    ACC_EQ(a, "Hello ");
    ck_assert(push_s(ts, &a, "nd|> trailing"));
    ACC_EQ(a, "Hello ");
    /* stays stopped until reset */
    ck_assert(push_s(ts, &a, "more"));
    flush(ts, &a);
    ACC_EQ(a, "Hello ");

    rlai_textstream_reset(ts);
    a.len = 0;
    ck_assert(!push_s(ts, &a, "x<"));
    ck_assert(!push_s(ts, &a, "|"));
    ck_assert(!push_s(ts, &a, "en"));
    ck_assert(!push_s(ts, &a, "d|"));
    ACC_EQ(a, "x");
    ck_assert(push_s(ts, &a, ">"));
    ACC_EQ(a, "x");
    rlai_textstream_free(ts);
}
END_TEST

START_TEST(test_partial_prefix_released)
{
    const char *stops[] = {"<|end|>", NULL};
    rlai_textstream *ts = mk(stops);
    acc a = {0};
    ck_assert(!push_s(ts, &a, "a<|e"));
    ACC_EQ(a, "a");
    ck_assert(!push_s(ts, &a, "x"));
    ACC_EQ(a, "a<|ex");
    /* a held prefix followed by a real stop: the prefix is text */
    ck_assert(!push_s(ts, &a, "<|en"));
    ck_assert(push_s(ts, &a, "<|end|>"));
    ACC_EQ(a, "a<|ex<|en");
    rlai_textstream_free(ts);

    /* overlapping self-prefix: "aab" in "aaab" */
    const char *s2[] = {"aab", NULL};
    ts = mk(s2);
    a.len = 0;
    ck_assert(!push_s(ts, &a, "a"));
    ck_assert(!push_s(ts, &a, "a"));
    ck_assert(!push_s(ts, &a, "a"));
    ACC_EQ(a, "a");
    ck_assert(push_s(ts, &a, "b"));
    ACC_EQ(a, "a");
    rlai_textstream_free(ts);
}
END_TEST

START_TEST(test_invalid_bytes)
{
    static const struct {
        const char *in;
        const char *out;
    } cases[] = {
        {"a\xFF" "b", "a" FFFD "b"},
        {"\xC0\x80", FFFD FFFD},                /* overlong */
        {"\xED\xA0\x80", FFFD FFFD FFFD},       /* surrogate */
        {"\xE0\x80", FFFD FFFD},                /* overlong 3-byte lead */
        {"\xF4\x90\x80\x80", FFFD FFFD FFFD FFFD}, /* > U+10FFFF */
        {"\xF5z", FFFD "z"},
        {"\xE2\x82z", FFFD "z"},                /* truncated, then ASCII */
        {"\x80\xBF", FFFD FFFD},                /* lone continuations */
        {"\xE2\x82\xAC", "\xE2\x82\xAC"},       /* valid euro sign */
        {"\xF0\x9F\x98", FFFD},                 /* truncated at the end */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        rlai_textstream *ts = mk(NULL);
        acc a = {0};
        ck_assert(!push_s(ts, &a, cases[i].in));
        flush(ts, &a);
        ck_assert_msg(a.len == strlen(cases[i].out) && !memcmp(a.buf, cases[i].out, a.len),
                      "case %zu", i);
        /* byte by byte gives the same */
        rlai_textstream_reset(ts);
        a.len = 0;
        for (const char *p = cases[i].in; *p; p++)
            ck_assert(!push(ts, &a, p, 1));
        flush(ts, &a);
        ck_assert_msg(a.len == strlen(cases[i].out) && !memcmp(a.buf, cases[i].out, a.len),
                      "case %zu bytewise", i);
        rlai_textstream_free(ts);
    }
}
END_TEST

START_TEST(test_flush)
{
    const char *stops[] = {"<|end|>", NULL};
    rlai_textstream *ts = mk(stops);
    acc a = {0};
    ck_assert(!push_s(ts, &a, "ab<|"));
    ACC_EQ(a, "ab");
    flush(ts, &a);
    ACC_EQ(a, "ab<|");
    /* usable again after flush */
    ck_assert(!push_s(ts, &a, "c\xE2\x82"));
    ACC_EQ(a, "ab<|c");
    flush(ts, &a);
    ACC_EQ(a, "ab<|c" FFFD);
    /* flushing twice releases nothing more */
    flush(ts, &a);
    ACC_EQ(a, "ab<|c" FFFD);
    rlai_textstream_free(ts);
}
END_TEST

START_TEST(test_multiple_stops)
{
    /* one stop is a prefix of another: the shorter completes first */
    const char *s1[] = {"<|end|>", "<|end", NULL};
    rlai_textstream *ts = mk(s1);
    acc a = {0};
    ck_assert(!push_s(ts, &a, "x<|en"));
    ck_assert(push_s(ts, &a, "d"));
    ACC_EQ(a, "x");
    rlai_textstream_free(ts);

    /* the longer listed second, pushed all at once */
    const char *s2[] = {"END", "ENDING", NULL};
    ts = mk(s2);
    a.len = 0;
    ck_assert(push_s(ts, &a, "the ENDING"));
    ACC_EQ(a, "the ");
    rlai_textstream_free(ts);

    /* the stop that ends first wins, whatever the split */
    const char *s3[] = {"bcd", "c", NULL};
    ts = mk(s3);
    a.len = 0;
    ck_assert(push_s(ts, &a, "abcd"));
    ACC_EQ(a, "ab");
    rlai_textstream_reset(ts);
    a.len = 0;
    ck_assert(!push_s(ts, &a, "a"));
    ck_assert(!push_s(ts, &a, "b"));
    ck_assert(push_s(ts, &a, "c"));
    ACC_EQ(a, "ab");
    rlai_textstream_free(ts);

    /* same end: the longer (earlier start) wins */
    const char *s4[] = {"bc", "abc", NULL};
    ts = mk(s4);
    a.len = 0;
    ck_assert(push_s(ts, &a, "xabc"));
    ACC_EQ(a, "x");
    rlai_textstream_free(ts);

    /* multibyte stop; invalid stop strings match the U+FFFD they become */
    const char *s5[] = {"\xC3\xA9", "\xFF", NULL};
    ts = mk(s5);
    a.len = 0;
    ck_assert(!push_s(ts, &a, "caf\xC3"));
    ACC_EQ(a, "caf");
    ck_assert(push_s(ts, &a, "\xA9!"));
    ACC_EQ(a, "caf");
    rlai_textstream_reset(ts);
    a.len = 0;
    ck_assert(push_s(ts, &a, "ok\xFE!"));
    ACC_EQ(a, "ok");
    rlai_textstream_free(ts);
}
END_TEST

/* Test RNG. */
static uint64_t rng_state;
static uint32_t rnd(uint32_t n)
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(rng_state >> 33) % n;
}

/* Expected output: the input up to the stop occurrence that ends first
 * (ties: starts first); the whole input if none. */
static size_t expected_len(const char *in, const char *const *stops, bool *stopped)
{
    size_t n = strlen(in);
    for (size_t end = 1; end <= n; end++) {
        size_t best = SIZE_MAX;
        for (int i = 0; stops[i]; i++) {
            size_t sl = strlen(stops[i]);
            if (sl && sl <= end && !memcmp(in + end - sl, stops[i], sl) && end - sl < best)
                best = end - sl;
        }
        if (best != SIZE_MAX) {
            *stopped = true;
            return best;
        }
    }
    *stopped = false;
    return n;
}

START_TEST(test_property_random_splits)
{
    static const char *const inputs[] = {
        "Hello world<|im_end|>ignored",
        "no stop here, just text \xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80 and more",
        "<<|<|i<|im<|im_e<|im_end|>",
        "abababababcabc",
        "\xF0\x9F\x98\x80\xF0\x9F\x98\x80</s>\xF0\x9F\x98\x80",
        "end: \xE2\x82\xAC\xE2\x82\xAC STOP\xE2\x82\xAC",
        "</</s</s>",
        "\xC3\xA9\xC3\xA9\xC3\xA8 \xC3\xA9\xC3\xA8!",
        "",
    };
    static const char *const stops[] = {"<|im_end|>", "</s>", "abc", "STOP\xE2\x82\xAC",
                                        "\xC3\xA9\xC3\xA8!", NULL};
    rlai_textstream *ts = mk(stops);
    rng_state = 2024;
    for (size_t k = 0; k < sizeof(inputs) / sizeof(inputs[0]); k++) {
        const char *in = inputs[k];
        size_t n = strlen(in);
        bool want_stop;
        size_t want = expected_len(in, stops, &want_stop);
        for (int trial = 0; trial < 300; trial++) {
            rlai_textstream_reset(ts);
            acc a = {0};
            size_t pos = 0;
            bool stopped = false;
            while (pos < n && !stopped) {
                size_t chunk = 1 + rnd(trial % 3 == 0 ? 2 : 6);
                if (chunk > n - pos)
                    chunk = n - pos;
                if (rnd(8) == 0)
                    ck_assert(!push(ts, &a, in + pos, 0)); /* empty pushes are harmless */
                stopped = push(ts, &a, in + pos, chunk);
                pos += chunk;
            }
            if (!stopped)
                flush(ts, &a);
            ck_assert_msg(stopped == want_stop, "input %zu trial %d", k, trial);
            ck_assert_msg(a.len == want && !memcmp(a.buf, in, want),
                          "input %zu trial %d: got %zu bytes, want %zu", k, trial, a.len, want);
        }
    }
    rlai_textstream_free(ts);
}
END_TEST

START_TEST(test_property_garbage)
{
    /* random bytes: output is valid UTF-8 and independent of the split */
    rng_state = 77;
    static char in[600];
    rlai_textstream *ts = mk(NULL);
    for (int round = 0; round < 50; round++) {
        for (size_t i = 0; i < sizeof(in); i++) {
            uint32_t r = rnd(10);
            /* bias towards UTF-8-looking bytes */
            in[i] = (char)(r < 3 ? 0x80 + rnd(64) : r < 5 ? 0xC0 + rnd(64) : r < 7 ? 'a' + rnd(26)
                                                                                 : rnd(256));
            if (in[i] == 0)
                in[i] = 'z';
        }
        static acc whole, split;
        whole.len = split.len = 0;
        rlai_textstream_reset(ts);
        push(ts, &whole, in, sizeof(in));
        flush(ts, &whole);
        rlai_textstream_reset(ts);
        for (size_t pos = 0; pos < sizeof(in);) {
            size_t c = 1 + rnd(5);
            if (c > sizeof(in) - pos)
                c = sizeof(in) - pos;
            push(ts, &split, in + pos, c);
            pos += c;
        }
        flush(ts, &split);
        ck_assert(utf8_valid(whole.buf, whole.len));
        ck_assert_uint_eq(whole.len, split.len);
        ck_assert(!memcmp(whole.buf, split.buf, whole.len));
    }
    rlai_textstream_free(ts);
}
END_TEST

START_TEST(test_large_push)
{
    /* one push much larger than the initial buffers */
    enum { N = 100000 };
    char *big = malloc(N);
    ck_assert_ptr_nonnull(big);
    for (int i = 0; i < N; i++)
        big[i] = (char)(i % 2 ? 0xFF : 'x'); /* every other byte becomes 3 bytes */
    const char *stops[] = {"never", NULL};
    rlai_textstream *ts = mk(stops);
    const char *o;
    size_t ol;
    ck_assert(!rlai_textstream_push(ts, big, N, &o, &ol));
    ck_assert_uint_eq(ol, (size_t)N / 2 * 4);
    ck_assert(utf8_valid(o, ol));
    rlai_textstream_free(ts);
    free(big);
}
END_TEST

static Suite *textstream_suite(void)
{
    Suite *s = suite_create("textstream");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_validator);
    tcase_add_test(tc, test_create);
    tcase_add_test(tc, test_emoji_split);
    tcase_add_test(tc, test_stop_split);
    tcase_add_test(tc, test_partial_prefix_released);
    tcase_add_test(tc, test_invalid_bytes);
    tcase_add_test(tc, test_flush);
    tcase_add_test(tc, test_multiple_stops);
    tcase_add_test(tc, test_property_random_splits);
    tcase_add_test(tc, test_property_garbage);
    tcase_add_test(tc, test_large_push);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(textstream_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
