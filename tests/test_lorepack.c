/* test_lorepack.c - LoreMaster's lore packs and session store, compiled
 * straight from plugins/loremaster/ (no host): the sample pack parses into
 * prompts holding its world, persona and rules; malformed packs are refused
 * with the file and the problem named and leave the set untouched; the
 * session store keeps per-character histories, evicts the least recently
 * used session, trims old turns and forgets on reset. */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lorepack.h"
#include "session.h"

#define SAMPLES RLAI_SOURCE_DIR "/samples/lore"

static char err[1024];

/* A minimal valid pack with one character `id`; `extra` is spliced into
 * the character object (may be ""). */
static char *pack_with(const char *id, const char *extra)
{
    static char buf[16384];
    snprintf(buf, sizeof buf,
             "{\"world\":{\"name\":\"Testland\",\"setting\":\"A flat grey test world.\"},"
             "\"characters\":[{\"id\":\"%s\",\"name\":\"Tess\",\"persona\":\"A tester.\"%s}]}",
             id, extra);
    return buf;
}

static int add(lorepack_set *s, const char *json, const char *source)
{
    err[0] = '\0';
    return lorepack_add_json(s, json, strlen(json), source, err, sizeof err);
}

/* Expects `json` to be refused as a format error whose message contains
 * the source name and every given fragment; the set must be unchanged. */
static void expect_bad(const char *json_in, const char *frag1, const char *frag2)
{
    char *json = strdup(json_in);   /* json_in may be pack_with's buffer */
    ck_assert_ptr_nonnull(json);
    lorepack_set s;
    lorepack_set_init(&s);
    ck_assert_int_eq(add(&s, pack_with("keep", ""), "keep.json"), 1);
    int rc = add(&s, json, "bad.json");
    ck_assert_msg(rc == RLAI_ERR_FORMAT, "rc %d for %s (%s)", rc, json, err);
    ck_assert_msg(strncmp(err, "bad.json: ", 10) == 0, "message does not name the file: %s", err);
    ck_assert_msg(strstr(err, frag1) != NULL, "'%s' not in: %s", frag1, err);
    if (frag2)
        ck_assert_msg(strstr(err, frag2) != NULL, "'%s' not in: %s", frag2, err);
    ck_assert_int_eq(s.n, 1);
    ck_assert_str_eq(s.chars[0].id, "keep");
    lorepack_set_free(&s);
    free(json);
}

START_TEST(sample_pack_parses)
{
    lorepack_set s;
    lorepack_set_init(&s);
    int n = lorepack_add_path(&s, SAMPLES, err, sizeof err);
    ck_assert_msg(n >= 3, "sample packs: %d (%s)", n, err);
    ck_assert_int_eq(s.n, n);

    const lore_character *b = lorepack_find(&s, "brannoc");
    ck_assert_ptr_nonnull(b);
    ck_assert_str_eq(b->name, "Brannoc Vell");
    ck_assert_str_eq(b->world, "Emberfall");
    ck_assert_ptr_nonnull(strstr(b->source, "emberfall.json"));
    const char *p = b->system_prompt;
    /* world, places, factions, persona, style, knowledge, examples, rules */
    ck_assert_ptr_nonnull(strstr(p, "This is the world of Emberfall."));
    ck_assert_ptr_nonnull(strstr(p, "- The Old Kiln: a temple"));
    ck_assert_ptr_nonnull(strstr(p, "- The Kilnwardens: "));
    ck_assert_ptr_nonnull(strstr(p, "You are Brannoc Vell, innkeeper of the Banked Hearth."));
    ck_assert_ptr_nonnull(strstr(p, "crushed your left hand"));
    ck_assert_ptr_nonnull(strstr(p, "How you speak: Slow, plain and gruff."));
    ck_assert_ptr_nonnull(strstr(p, "You know nothing about:\n- what the Kilnwardens do"));
    ck_assert_ptr_nonnull(strstr(p, "Sit, friend."));
    ck_assert_ptr_nonnull(strstr(p, "Rules:\n- The player is a traveller"));
    ck_assert(p[strlen(p) - 1] != '\n');
    /* The world lore comes first and is identical for every character, so
     * the prefix cache can share it; the persona follows. */
    const lore_character *y = lorepack_find(&s, "ysolde");
    ck_assert_ptr_nonnull(y);
    const char *you = strstr(p, "\nYou are ");
    ck_assert_ptr_nonnull(you);
    size_t world_len = (size_t)(you - p);
    ck_assert_int_eq(strncmp(p, y->system_prompt, world_len), 0);
    ck_assert_ptr_null(strstr(p, "Ysolde"));
    ck_assert_ptr_nonnull(strstr(y->system_prompt, "You are Sister Ysolde"));
    /* Moderate lore per character: ~300-700 tokens at ~4 bytes a token. */
    for (int i = 0; i < s.n; i++) {
        size_t len = strlen(s.chars[i].system_prompt);
        ck_assert_msg(len > 1200 && len < 2800, "%s: %zu bytes of lore", s.chars[i].id, len);
        ck_assert(s.chars[i].title[0] != '\0');
    }
    /* Sampling from the pack. */
    ck_assert_float_eq_tol(b->sampling.temperature, 0.7f, 1e-6f);
    ck_assert_int_eq(b->sampling.max_tokens, 160);
    ck_assert_ptr_null(lorepack_find(&s, "nobody"));
    char ids[256];
    lorepack_ids(&s, ids, sizeof ids);
    ck_assert_ptr_nonnull(strstr(ids, "brannoc"));
    ck_assert_ptr_nonnull(strstr(ids, "pell"));
    char tiny[8];
    lorepack_ids(&s, tiny, sizeof tiny);
    ck_assert_int_lt(strlen(tiny), sizeof tiny);
    lorepack_set_free(&s);
    ck_assert_int_eq(s.n, 0);
}
END_TEST

START_TEST(optional_fields_and_forms)
{
    lorepack_set s;
    lorepack_set_init(&s);
    /* A list given as a single string, a character's own sampling and rules,
     * comment keys, no title. */
    const char *json =
        "{\"_comment\":\"x\",\"format\":\"rlai-lore/1\",\"world\":{\"name\":\"W\",\"setting\":\"S.\"},"
        "\"sampling\":{\"temperature\":0.5,\"max_tokens\":40},\"rules\":\"Be brief.\","
        "\"characters\":[{\"id\":\"a-1\",\"name\":\"A\",\"persona\":\"P.\",\"knows\":\"the well\","
        "\"rules\":[\"Never lie.\"],\"sampling\":{\"temperature\":0.1},\"_note\":1},"
        "{\"id\":\"b_2\",\"name\":\"B\",\"persona\":\"Q.\"}]}";
    ck_assert_int_eq(add(&s, json, "ok.json"), 2);
    const lore_character *a = lorepack_find(&s, "a-1");
    ck_assert_ptr_nonnull(a);
    ck_assert_str_eq(a->title, "");
    ck_assert_ptr_nonnull(strstr(a->system_prompt, "You are A.\nP."));
    ck_assert_ptr_nonnull(strstr(a->system_prompt, "You know about:\n- the well"));
    ck_assert_ptr_nonnull(strstr(a->system_prompt, "Rules:\n- Be brief.\n- Never lie."));
    ck_assert_float_eq_tol(a->sampling.temperature, 0.1f, 1e-6f);
    ck_assert_int_eq(a->sampling.max_tokens, 40);    /* the pack's */
    ck_assert(a->sampling.top_p < 0);                /* unset */
    const lore_character *b = lorepack_find(&s, "b_2");
    ck_assert_float_eq_tol(b->sampling.temperature, 0.5f, 1e-6f);
    ck_assert_ptr_null(strstr(b->system_prompt, "Never lie."));
    lorepack_set_free(&s);
}
END_TEST

START_TEST(malformed_packs_are_named)
{
    expect_bad("{\"world\": {\"name\": \"W\",", "malformed JSON at line 1, column", NULL);
    expect_bad("{\n\"world\" {}}", "malformed JSON at line 2", NULL);
    expect_bad("", "empty file", NULL);
    expect_bad("[1, 2]", "must be a JSON object", NULL);
    expect_bad("{} {}", "text after the pack", NULL);
    expect_bad("{\"characters\":[]}", "missing \"world\"", NULL);
    /* missing name */
    expect_bad("{\"world\":{\"name\":\"W\",\"setting\":\"S\"},\"characters\":[{\"id\":\"x\",\"persona\":\"p\"}]}",
               "characters[0] (\"x\")", "missing \"name\"");
    expect_bad("{\"world\":{\"setting\":\"S\"},\"characters\":[]}", "world: missing \"name\"", NULL);
    expect_bad("{\"world\":{\"name\":\"W\",\"setting\":\"S\"}}", "missing \"characters\"", NULL);
    expect_bad("{\"world\":{\"name\":\"W\",\"setting\":\"S\"},\"characters\":[]}", "\"characters\" is empty",
               NULL);
    /* duplicate id, inside one pack and against an earlier pack */
    expect_bad("{\"world\":{\"name\":\"W\",\"setting\":\"S\"},\"characters\":["
               "{\"id\":\"x\",\"name\":\"N\",\"persona\":\"p\"},{\"id\":\"x\",\"name\":\"M\",\"persona\":\"q\"}]}",
               "characters[1] (\"x\")", "duplicate character id \"x\"");
    expect_bad(pack_with("keep", ""), "duplicate character id \"keep\"", "already defined in keep.json");
    /* wrong types */
    expect_bad("{\"world\":{\"name\":\"W\",\"setting\":\"S\"},\"characters\":{}}",
               "\"characters\" must be an array", NULL);
    expect_bad("{\"world\":\"W\",\"characters\":[]}", "\"world\" must be an object", NULL);
    expect_bad("{\"world\":{\"name\":\"W\",\"setting\":\"S\"},\"characters\":[7]}", "characters[0] must be an object",
               NULL);
    expect_bad(pack_with("x", ",\"title\":3"), "\"title\" must be a string", NULL);
    expect_bad("{\"world\":{\"name\":\"W\",\"setting\":\"S\"},\"characters\":[{\"id\":\"x\",\"name\":\"N\","
               "\"persona\":42}]}",
               "\"persona\" must be a string", NULL);
    expect_bad(pack_with("x", ",\"knows\":[\"a\",5]"), "\"knows\"[1] must be a string", NULL);
    expect_bad(pack_with("x", ",\"example_lines\":{}"), "\"example_lines\" must be a string or an array", NULL);
    expect_bad(pack_with("x", ",\"sampling\":{\"temperature\":5}"), "\"temperature\" = 5 is outside", NULL);
    expect_bad(pack_with("x", ",\"sampling\":{\"max_tokens\":1.5}"), "\"max_tokens\" must be an integer", NULL);
    expect_bad(pack_with("x", ",\"sampling\":{\"top_p\":\"high\"}"), "\"top_p\" must be a number", NULL);
    expect_bad("{\"world\":{\"name\":\"W\",\"setting\":\"S\",\"places\":[{\"name\":\"P\"}]},\"characters\":[]}",
               "world.places[0]", "missing \"description\"");
    expect_bad("{\"world\":{\"name\":\"W\",\"setting\":\"S\",\"factions\":\"none\"},\"characters\":[]}",
               "\"factions\" must be an array", NULL);
    /* values and keys */
    expect_bad(pack_with("Bad Id", ""), "id \"Bad Id\" must be", NULL);
    expect_bad(pack_with("x", ",\"persna\":\"typo\""), "unknown key \"persna\"", NULL);
    expect_bad(pack_with("x", ",\"name\":\"again\""), "key \"name\" given twice", NULL);
    expect_bad(pack_with("x", ",\"title\":\"  \""), "\"title\" is empty", NULL);
    expect_bad(pack_with("x", ",\"title\":\"\\u00ff\xff\""), "not valid UTF-8", NULL);
    expect_bad("{\"format\":\"rlai-lore/9\",\"world\":{\"name\":\"W\",\"setting\":\"S\"},\"characters\":[]}",
               "\"format\" must be \"rlai-lore/1\"", NULL);

    /* a field over the limit, a pack over the size limit */
    char *big = malloc(LOREPACK_MAX_STR + 64);
    ck_assert_ptr_nonnull(big);
    strcpy(big, ",\"title\":\"");
    memset(big + 10, 'a', LOREPACK_MAX_STR + 1);
    strcpy(big + 10 + LOREPACK_MAX_STR + 1, "\"");
    expect_bad(pack_with("x", big), "\"title\" is longer than", NULL);
    free(big);
    lorepack_set s;
    lorepack_set_init(&s);
    ck_assert_int_eq(lorepack_add_json(&s, "{}", LOREPACK_MAX_FILE_BYTES + 1u, "huge.json", err, sizeof err),
                     RLAI_ERR_TOO_LARGE);
    ck_assert_ptr_nonnull(strstr(err, "huge.json"));
    ck_assert_int_eq(lorepack_add_json(NULL, "{}", 2, "x", err, sizeof err), RLAI_ERR_INVALID_ARG);
    ck_assert_int_eq(s.n, 0);
}
END_TEST

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

START_TEST(folders_load_all_or_nothing)
{
    char dir[] = "/tmp/rlai-lore-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char a[128], b[128], c[128], hidden[128];
    snprintf(a, sizeof a, "%s/a.json", dir);
    snprintf(b, sizeof b, "%s/b.json", dir);
    snprintf(c, sizeof c, "%s/notes.txt", dir);
    snprintf(hidden, sizeof hidden, "%s/.x.json", dir);
    lorepack_set s;
    lorepack_set_init(&s);

    ck_assert_int_eq(lorepack_add_path(&s, dir, err, sizeof err), RLAI_ERR_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(err, "no *.json lore packs"));
    ck_assert_int_eq(lorepack_add_path(&s, "/nonexistent/lore", err, sizeof err), RLAI_ERR_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(err, "/nonexistent/lore"));

    write_file(a, pack_with("first", ""));
    write_file(b, pack_with("second", ""));
    write_file(c, "not a pack");
    write_file(hidden, "{ broken");
    ck_assert_int_eq(lorepack_add_path(&s, dir, err, sizeof err), 2);
    ck_assert_int_eq(s.n, 2);
    ck_assert_str_eq(s.chars[0].id, "first");    /* name order */
    ck_assert_str_eq(s.chars[1].id, "second");
    lorepack_set_free(&s);

    /* One bad file: nothing of the folder is kept, the message names it. */
    write_file(b, pack_with("second", ",\"persona\":1"));
    ck_assert_int_eq(add(&s, pack_with("before", ""), "x.json"), 1);
    ck_assert_int_eq(lorepack_add_path(&s, dir, err, sizeof err), RLAI_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(err, b));
    ck_assert_int_eq(s.n, 1);
    ck_assert_str_eq(s.chars[0].id, "before");
    /* A single file path works too. */
    ck_assert_int_eq(lorepack_add_path(&s, a, err, sizeof err), 1);
    ck_assert_int_eq(s.n, 2);
    lorepack_set_free(&s);

    unlink(a);
    unlink(b);
    unlink(c);
    unlink(hidden);
    rmdir(dir);
}
END_TEST

/* ---- session store ------------------------------------------------------- */

START_TEST(sessions_keep_histories)
{
    session_store *st;
    ck_assert_int_eq(session_store_new(0, 4, &st), RLAI_ERR_INVALID_ARG);
    ck_assert_int_eq(session_store_new(4, 8, &st), 0);
    session_history h;
    ck_assert_int_eq(session_store_snapshot(st, "s1", "brannoc", &h), 0);
    ck_assert_int_eq(h.n, 0);
    ck_assert_int_eq(h.n_total, 0);
    uint64_t serial = h.serial;
    session_history_free(&h);
    int turn = 0;
    ck_assert_int_eq(session_store_append(st, "s1", "brannoc", serial, "hello", "Sit, friend.", 0, &turn), 0);
    ck_assert_int_eq(turn, 1);
    ck_assert_int_eq(session_store_append(st, "s1", "brannoc", serial, "ale?", "Two coppers.", 0, &turn), 0);
    ck_assert_int_eq(turn, 2);
    /* another character of the same session has its own history */
    ck_assert_int_eq(session_store_snapshot(st, "s1", "pell", &h), 0);
    ck_assert_int_eq(h.n, 0);
    ck_assert(h.serial != serial);
    session_history_free(&h);
    ck_assert_int_eq(session_store_snapshot(st, "s1", "brannoc", &h), 0);
    ck_assert_int_eq(h.n, 2);
    ck_assert_int_eq(h.n_total, 2);
    ck_assert_str_eq(h.turns[0].user, "hello");
    ck_assert_str_eq(h.turns[1].reply, "Two coppers.");
    session_history_free(&h);
    ck_assert_int_eq(session_store_count(st), 1);

    /* bad ids */
    ck_assert_int_eq(session_store_snapshot(st, "", "brannoc", &h), RLAI_ERR_INVALID_ARG);
    ck_assert_int_eq(session_store_snapshot(st, "has space", "brannoc", &h), RLAI_ERR_INVALID_ARG);
    char longid[SESSION_MAX_ID + 2];
    memset(longid, 'a', sizeof longid - 1);
    longid[sizeof longid - 1] = '\0';
    ck_assert(!session_id_ok(longid));
    longid[SESSION_MAX_ID] = '\0';
    ck_assert(session_id_ok(longid));
    ck_assert_int_eq(session_store_append(st, "s1", "brannoc", serial, NULL, "x", 0, NULL), RLAI_ERR_INVALID_ARG);

    /* reset forgets every character; a generation that started before the
     * reset cannot bring the history back */
    ck_assert(session_store_reset(st, "s1"));
    ck_assert(!session_store_reset(st, "s1"));
    ck_assert_int_eq(session_store_count(st), 0);
    ck_assert_int_eq(session_store_append(st, "s1", "brannoc", serial, "late", "reply", 0, &turn),
                     RLAI_ERR_NOT_FOUND);
    ck_assert_int_eq(session_store_snapshot(st, "s1", "brannoc", &h), 0);
    ck_assert_int_eq(h.n, 0);
    ck_assert_int_eq(h.n_total, 0);
    ck_assert(h.serial != serial);
    session_history_free(&h);
    session_store_free(st);
    session_store_free(NULL);
}
END_TEST

START_TEST(sessions_lru_evicts)
{
    session_store *st;
    ck_assert_int_eq(session_store_new(2, 8, &st), 0);
    session_history h1, h2, h3;
    ck_assert_int_eq(session_store_snapshot(st, "one", "c", &h1), 0);
    ck_assert_int_eq(session_store_snapshot(st, "two", "c", &h2), 0);
    ck_assert_int_eq(session_store_append(st, "one", "c", h1.serial, "u", "r", 0, NULL), 0);
    ck_assert_int_eq(session_store_append(st, "two", "c", h2.serial, "u", "r", 0, NULL), 0);
    /* "one" used last: a third session evicts "two" */
    session_history t;
    ck_assert_int_eq(session_store_snapshot(st, "one", "c", &t), 0);
    session_history_free(&t);
    ck_assert_int_eq(session_store_snapshot(st, "three", "c", &h3), 0);
    ck_assert_int_eq(session_store_count(st), 2);
    ck_assert_int_eq(session_store_append(st, "two", "c", h2.serial, "u2", "r2", 0, NULL), RLAI_ERR_NOT_FOUND);
    ck_assert_int_eq(session_store_snapshot(st, "one", "c", &t), 0);
    ck_assert_int_eq(t.n, 1);
    session_history_free(&t);
    /* "two" comes back empty, evicting "three" (least recent now) */
    ck_assert_int_eq(session_store_snapshot(st, "two", "c", &t), 0);
    ck_assert_int_eq(t.n, 0);
    session_history_free(&t);
    ck_assert_int_eq(session_store_append(st, "three", "c", h3.serial, "u", "r", 0, NULL), RLAI_ERR_NOT_FOUND);
    ck_assert_int_eq(session_store_count(st), 2);
    session_history_free(&h1);
    session_history_free(&h2);
    session_history_free(&h3);
    session_store_free(st);
}
END_TEST

START_TEST(sessions_trim_old_turns)
{
    session_store *st;
    ck_assert_int_eq(session_store_new(4, 3, &st), 0);
    session_history h;
    ck_assert_int_eq(session_store_snapshot(st, "s", "c", &h), 0);
    uint64_t serial = h.serial;
    session_history_free(&h);
    char u[16], r[16];
    for (int i = 1; i <= 5; i++) {
        snprintf(u, sizeof u, "u%d", i);
        snprintf(r, sizeof r, "r%d", i);
        int turn;
        ck_assert_int_eq(session_store_append(st, "s", "c", serial, u, r, 0, &turn), 0);
        ck_assert_int_eq(turn, i);
    }
    ck_assert_int_eq(session_store_snapshot(st, "s", "c", &h), 0);
    ck_assert_int_eq(h.n, 3);        /* max_turns */
    ck_assert_int_eq(h.n_total, 5);
    ck_assert_str_eq(h.turns[0].user, "u3");
    ck_assert_str_eq(h.turns[2].reply, "r5");
    session_history_free(&h);
    /* the caller left out 2 turns to fit the context: they go for good */
    ck_assert_int_eq(session_store_append(st, "s", "c", serial, "u6", "r6", 2, NULL), 0);
    ck_assert_int_eq(session_store_snapshot(st, "s", "c", &h), 0);
    ck_assert_int_eq(h.n, 2);
    ck_assert_str_eq(h.turns[0].user, "u5");
    ck_assert_str_eq(h.turns[1].user, "u6");
    ck_assert_int_eq(h.n_total, 6);
    session_history_free(&h);
    /* dropping more than there is leaves just the new turn */
    ck_assert_int_eq(session_store_append(st, "s", "c", serial, "u7", "r7", 99, NULL), 0);
    ck_assert_int_eq(session_store_snapshot(st, "s", "c", &h), 0);
    ck_assert_int_eq(h.n, 1);
    ck_assert_str_eq(h.turns[0].reply, "r7");
    session_history_free(&h);
    session_store_free(st);
}
END_TEST

typedef struct worker_arg {
    session_store *st;
    int id;
} worker_arg;

static void *worker(void *p)
{
    worker_arg *a = p;
    char sid[16];
    snprintf(sid, sizeof sid, "w%d", a->id % 3);
    for (int i = 0; i < 200; i++) {
        session_history h;
        if (session_store_snapshot(a->st, "shared", "c", &h) == 0) {
            session_store_append(a->st, "shared", "c", h.serial, "u", "r", 0, NULL);
            session_history_free(&h);
        }
        if (session_store_snapshot(a->st, sid, "c", &h) == 0)
            session_history_free(&h);
        if (i % 50 == 0)
            session_store_reset(a->st, sid);
    }
    return NULL;
}

START_TEST(sessions_threads)
{
    session_store *st;
    ck_assert_int_eq(session_store_new(8, 10000, &st), 0);
    pthread_t th[4];
    worker_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (worker_arg){ st, i };
        ck_assert_int_eq(pthread_create(&th[i], NULL, worker, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    session_history h;
    ck_assert_int_eq(session_store_snapshot(st, "shared", "c", &h), 0);
    ck_assert_int_eq(h.n, 800);
    ck_assert_int_eq(h.n_total, 800);
    session_history_free(&h);
    session_store_free(st);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("lorepack");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, sample_pack_parses);
    tcase_add_test(tc, optional_fields_and_forms);
    tcase_add_test(tc, malformed_packs_are_named);
    tcase_add_test(tc, folders_load_all_or_nothing);
    tcase_add_test(tc, sessions_keep_histories);
    tcase_add_test(tc, sessions_lru_evicts);
    tcase_add_test(tc, sessions_trim_old_turns);
    tcase_add_test(tc, sessions_threads);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
