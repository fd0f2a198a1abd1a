/* test_error.c - the one error table (rlai/error.h): every C error code has
 * a distinct value, name and message and maps onto a wire code, an HTTP
 * status and an OpenAI code that agree with each other; the wire table
 * equals proto/PROTOCOL.md section 8 row for row. */
#include <check.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rlai/error.h"

#ifndef RLAI_SOURCE_DIR
#error "RLAI_SOURCE_DIR must be defined (the project source root)"
#endif

typedef struct err_row {
    const char *name;
    int code, wire, http;
    const char *oai, *msg;
} err_row;

static const err_row rows[] = {
#define X(name, code, wire, http, oai, msg) { #name, code, RLAI_PE_##wire, http, oai, msg },
    RLAI_ERROR_MAP(X)
#undef X
};
static const int n_rows = (int)(sizeof rows / sizeof rows[0]);

typedef struct wire_row {
    const char *name;
    int code;
    const char *meaning;
} wire_row;

static const wire_row wires[] = {
#define X(name, code, meaning) { #name, code, meaning },
    RLAI_WIRE_CODE_MAP(X)
#undef X
};
static const int n_wires = (int)(sizeof wires / sizeof wires[0]);

START_TEST(test_codes_distinct_and_named)
{
    ck_assert_int_ge(n_rows, 18);
    for (int i = 0; i < n_rows; i++) {
        ck_assert_int_lt(rows[i].code, 0);
        ck_assert_str_eq(rlai_err_name(rows[i].code), rows[i].name);
        ck_assert_str_eq(rlai_strerror(rows[i].code), rows[i].msg);
        ck_assert_str_ne(rows[i].msg, "");
        for (int j = 0; j < i; j++) {
            ck_assert_int_ne(rows[i].code, rows[j].code);
            ck_assert_str_ne(rows[i].name, rows[j].name);
            ck_assert_str_ne(rows[i].msg, rows[j].msg);
        }
    }
    /* codes are dense from -1: a new one is appended, none reused */
    for (int i = 0; i < n_rows; i++)
        ck_assert_int_eq(rows[i].code, -(i + 1));
    ck_assert_str_eq(rlai_strerror(0), "success");
    ck_assert_str_eq(rlai_err_name(0), "OK");
    ck_assert_str_eq(rlai_strerror(-1000), "unknown error");
    ck_assert_str_eq(rlai_err_name(-1000), "UNKNOWN");
    ck_assert_str_eq(rlai_strerror(5), "unknown error");
}
END_TEST

START_TEST(test_wire_codes)
{
    for (int i = 0; i < n_wires; i++) {
        ck_assert_int_eq(wires[i].code, i + 1);
        ck_assert_str_eq(rlai_wire_code_name(wires[i].code), wires[i].name);
        ck_assert_str_eq(rlai_wire_code_meaning(wires[i].code), wires[i].meaning);
    }
    ck_assert_str_eq(rlai_wire_code_name(0), "UNKNOWN");
    ck_assert_str_eq(rlai_wire_code_name(n_wires + 1), "UNKNOWN");
    ck_assert_str_eq(rlai_wire_code_meaning(99), "");
    /* unknown engine codes are an inference failure on the wire, 500 over HTTP */
    ck_assert_int_eq(rlai_err_wire_code(-1000), RLAI_PE_ENGINE);
    const char *oai = "x";
    ck_assert_int_eq(rlai_err_http_status(-1000, &oai), 500);
    ck_assert_ptr_null(oai);
    ck_assert_int_eq(rlai_err_http_status(-1000, NULL), 500);
}
END_TEST

/* The three mappings tell one story: whatever a client sees on the wire
 * is what an HTTP client sees in status and code. */
START_TEST(test_mappings_agree)
{
    for (int i = 0; i < n_rows; i++) {
        const err_row *r = &rows[i];
        const char *oai = "unset";
        ck_assert_int_eq(rlai_err_wire_code(r->code), r->wire);
        ck_assert_int_eq(rlai_err_http_status(r->code, &oai), r->http);
        if (r->oai)
            ck_assert_str_eq(oai, r->oai);
        else
            ck_assert_ptr_null(oai);
        ck_assert_int_ge(r->http, 400);
        ck_assert_int_lt(r->http, 600);
        bool ctx = r->oai && !strcmp(r->oai, "context_length_exceeded");
        ck_assert_msg(ctx == (r->wire == RLAI_PE_CONTEXT_FULL), "%s: context_length_exceeded iff CONTEXT_FULL",
                      r->name);
        ck_assert_msg((r->http == 429) == (r->wire == RLAI_PE_BUSY), "%s: 429 iff BUSY", r->name);
        ck_assert_msg((r->http == 413) == (r->wire == RLAI_PE_TOO_LARGE), "%s: 413 iff TOO_LARGE", r->name);
        ck_assert_msg((r->http == 404) == (r->wire == RLAI_PE_NOT_FOUND), "%s: 404 iff NOT_FOUND", r->name);
        ck_assert_msg((r->http == 504) == (r->wire == RLAI_PE_TIMEOUT), "%s: 504 iff TIMEOUT", r->name);
        ck_assert_msg((r->http == 501) == (r->wire == RLAI_PE_NOT_IMPLEMENTED), "%s: 501 iff NOT_IMPLEMENTED",
                      r->name);
        if (r->wire == RLAI_PE_BAD_REQUEST || r->wire == RLAI_PE_CONTEXT_FULL)
            ck_assert_msg(r->http < 500, "%s: a client's mistake is a 4xx", r->name);
        if (r->wire == RLAI_PE_ENGINE || r->wire == RLAI_PE_INTERNAL)
            ck_assert_msg(r->http >= 500, "%s: an engine failure is a 5xx", r->name);
    }
    /* the cases the old hand-written mappers disagreed on */
    ck_assert_int_eq(rlai_err_wire_code(RLAI_ERR_KV_FULL), RLAI_PE_CONTEXT_FULL);
    ck_assert_int_eq(rlai_err_wire_code(RLAI_ERR_FORMAT), RLAI_PE_BAD_REQUEST);
    ck_assert_int_eq(rlai_err_http_status(RLAI_ERR_FORMAT, NULL), 400);
}
END_TEST

/* PROTOCOL.md section 8: `| code | `NAME` | meaning |` rows, in order. */
START_TEST(test_protocol_md_matches)
{
    const char *path = RLAI_SOURCE_DIR "/proto/PROTOCOL.md";
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    char line[1024];
    bool in_table = false;
    int seen = 0;
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "## 8. Error codes", 17)) {
            in_table = true;
            continue;
        }
        if (in_table && !strncmp(line, "## ", 3))
            break;
        if (!in_table || line[0] != '|')
            continue;
        int code;
        char name[64], meaning[512];
        if (sscanf(line, "| %d | `%63[A-Z_]` | %511[^\n]", &code, name, meaning) != 3)
            continue; /* header and rule rows */
        size_t n = strlen(meaning);
        while (n && (meaning[n - 1] == ' ' || meaning[n - 1] == '|'))
            meaning[--n] = 0;
        ck_assert_int_lt(seen, n_wires);
        ck_assert_int_eq(code, wires[seen].code);
        ck_assert_str_eq(name, wires[seen].name);
        ck_assert_str_eq(meaning, wires[seen].meaning);
        seen++;
    }
    fclose(f);
    ck_assert_int_eq(seen, n_wires);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("error");
    TCase *tc = tcase_create("table");
    tcase_add_test(tc, test_codes_distinct_and_named);
    tcase_add_test(tc, test_wire_codes);
    tcase_add_test(tc, test_mappings_agree);
    tcase_add_test(tc, test_protocol_md_matches);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
