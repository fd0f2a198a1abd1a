/* test_json_msgpack.c - host/json_msgpack.c: msgpack -> JSON keeps every
 * integer exact (u64, i64 beyond 2^53), never cuts a string or key at NUL,
 * never truncates long keys; JSON -> msgpack round trip of ordinary values. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "json_msgpack.h"

static char *convert(const msgpack_sbuffer *sb)
{
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    ck_assert_int_eq(msgpack_unpack_next(&up, sb->data, sb->size, NULL), MSGPACK_UNPACK_SUCCESS);
    cJSON *v = rlai_msgpack_to_json(&up.data);
    ck_assert_ptr_nonnull(v);
    char *txt = cJSON_PrintUnformatted(v);
    cJSON_Delete(v);
    msgpack_unpacked_destroy(&up);
    return txt;
}

START_TEST(integers_stay_exact)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 6);
    msgpack_pack_uint64(&pk, UINT64_MAX);
    msgpack_pack_uint64(&pk, 9007199254740993ull);      /* 2^53 + 1: not a double */
    msgpack_pack_int64(&pk, INT64_MIN);
    msgpack_pack_int64(&pk, -9007199254740993ll);
    msgpack_pack_uint64(&pk, 42);
    msgpack_pack_double(&pk, 0.5);
    char *txt = convert(&sb);
    ck_assert_str_eq(txt, "[18446744073709551615,9007199254740993,-9223372036854775808,-9007199254740993,42,0.5]");
    free(txt);
    msgpack_sbuffer_destroy(&sb);
}
END_TEST

START_TEST(nul_and_long_keys_kept)
{
    char longkey[1000];
    memset(longkey, 'k', sizeof(longkey));
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 3);
    msgpack_pack_str(&pk, sizeof(longkey));
    msgpack_pack_str_body(&pk, longkey, sizeof(longkey));
    msgpack_pack_int(&pk, 1);
    msgpack_pack_str(&pk, 1);
    msgpack_pack_str_body(&pk, "s", 1);
    msgpack_pack_str(&pk, 5);
    msgpack_pack_str_body(&pk, "a\0b\"c", 5);
    msgpack_pack_int(&pk, 7);                 /* a non-string key */
    msgpack_pack_true(&pk);
    char *txt = convert(&sb);
    /* parse back: the long key is whole, the NUL string intact */
    cJSON *v = cJSON_Parse(txt);
    ck_assert_ptr_nonnull(v);
    char key[1001];
    memcpy(key, longkey, sizeof(longkey));
    key[1000] = 0;
    ck_assert_ptr_nonnull(cJSON_GetObjectItemCaseSensitive(v, key));
    ck_assert(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(v, "7")));
    ck_assert_ptr_nonnull(strstr(txt, "\"s\":\"a\\u0000b\\\"c\""));
    cJSON_Delete(v);
    free(txt);
    msgpack_sbuffer_destroy(&sb);

    /* a key holding NUL: the whole map is written exactly */
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 1);
    msgpack_pack_str(&pk, 3);
    msgpack_pack_str_body(&pk, "x\0y", 3);
    msgpack_pack_uint64(&pk, UINT64_MAX);
    txt = convert(&sb);
    ck_assert_str_eq(txt, "{\"x\\u0000y\":18446744073709551615}");
    free(txt);
    msgpack_sbuffer_destroy(&sb);
}
END_TEST

START_TEST(json_round_trip)
{
    const char *in = "{\"a\":[1,-2,3.25,true,null,\"t\"],\"b\":{\"c\":9007199254740992}}";
    cJSON *j = cJSON_Parse(in);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    ck_assert_int_eq(rlai_json_to_msgpack(j, &pk), 0);
    char *txt = convert(&sb);
    ck_assert_str_eq(txt, in);
    free(txt);
    cJSON_Delete(j);
    msgpack_sbuffer_destroy(&sb);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("json_msgpack");
    TCase *tc = tcase_create("convert");
    tcase_add_test(tc, integers_stay_exact);
    tcase_add_test(tc, nul_and_long_keys_kept);
    tcase_add_test(tc, json_round_trip);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
