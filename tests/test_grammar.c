/* test_grammar.c - grammar-constrained sampling (engine/grammar.c):
 * schemas compile or are refused with the right code and a message naming
 * the keyword; the byte matcher accepts valid and rejects invalid JSON;
 * the fast token mask (trie walk, plain-token shortcut) equals a brute
 * force mask on states reached by random walks over the real vocabulary;
 * and on the real default model, greedy output under a schema is complete,
 * valid JSON, token-for-token the same with speculative decoding (greedy
 * and sampled; a copying answer mostly drafted) and every token was
 * allowed by the mask of its step. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rlai/engine.h"
#include "rlai/grammar.h"
#include "grammar.h"
#include "rlai/gguf.h"
#include "tokenizer.h"

#define MODEL RLAI_MODELS_DIR "/SmolLM2-135M-Instruct.Q4_1.gguf"

static rlai_grammar *schema(const char *s)
{
    rlai_grammar *g = NULL;
    char err[256];
    int rc = rlai_grammar_from_json_schema(s, strlen(s), &g, err, sizeof(err));
    ck_assert_msg(rc == 0, "schema %s: %s", s, err);
    ck_assert_ptr_nonnull(g);
    return g;
}

static bool acc(const rlai_grammar *g, const char *t) { return rlai_grammar_accepts(g, t, strlen(t)); }

START_TEST(json_object_accepts_objects_only)
{
    rlai_grammar *g = NULL;
    ck_assert_int_eq(rlai_grammar_json_object(&g), 0);
    ck_assert(acc(g, "{}"));
    ck_assert(acc(g, "{ }"));
    ck_assert(acc(g, "{\"a\":1}"));
    ck_assert(acc(g, "{\"a\": [1, 2.5, -3e2, true, false, null, \"x\\n\\u00e9\", {\"b\": {}}]}"));
    ck_assert(acc(g, "{\n  \"k\": \"caf\xc3\xa9\"\n}"));
    ck_assert(!acc(g, "[]"));
    ck_assert(!acc(g, "\"str\""));
    ck_assert(!acc(g, "{"));
    ck_assert(!acc(g, "{\"a\":}"));
    ck_assert(!acc(g, "{\"a\":1,}"));
    ck_assert(!acc(g, "{\"a\":01}"));
    ck_assert(!acc(g, "{\"a\":\"\\x\"}"));
    ck_assert(!acc(g, "{\"a\":\"line\nbreak\"}"));
    ck_assert(!acc(g, "{\"a\":\"\xff\"}"));
    ck_assert(!acc(g, "{}x"));
    ck_assert(!acc(g, "{}  "));
    /* whitespace is bounded: a run of 17 spaces is refused */
    ck_assert(acc(g, "{                }"));
    ck_assert(!acc(g, "{                 }"));
    /* incremental: a prefix is fed, cannot end; the rest completes it */
    rlai_grammar_matcher *m = NULL;
    ck_assert_int_eq(rlai_grammar_matcher_new(g, &m), 0);
    ck_assert_int_eq(rlai_grammar_matcher_feed(m, "{\"a\"", 4), 0);
    ck_assert(!rlai_grammar_matcher_can_end(m));
    ck_assert_int_eq(rlai_grammar_matcher_feed(m, "}", 1), RLAI_ERR_INVALID_ARG);
    ck_assert_int_eq(rlai_grammar_matcher_feed(m, ":2}", 3), 0);
    ck_assert(rlai_grammar_matcher_can_end(m));
    ck_assert(rlai_grammar_matcher_done(m));
    rlai_grammar_matcher_free(m);
    rlai_grammar_unref(g);
}
END_TEST

START_TEST(schema_objects_and_types)
{
    rlai_grammar *g = schema("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
                             "\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":"
                             "{\"type\":\"string\"},\"maxItems\":2}},\"required\":[\"name\",\"age\"],"
                             "\"additionalProperties\":false}");
    ck_assert(acc(g, "{\"name\":\"Bo\",\"age\":7}"));
    ck_assert(acc(g, "{ \"name\": \"Bo\", \"age\": -7, \"tags\": [\"a\", \"b\"] }"));
    ck_assert(acc(g, "{\"name\":\"\",\"age\":0,\"tags\":[]}"));
    ck_assert(!acc(g, "{\"age\":7,\"name\":\"Bo\"}"));          /* schema order */
    ck_assert(!acc(g, "{\"name\":\"Bo\"}"));                   /* required age */
    ck_assert(!acc(g, "{\"name\":\"Bo\",\"age\":7.5}"));       /* integer */
    ck_assert(!acc(g, "{\"name\":\"Bo\",\"age\":7,\"tags\":[\"a\",\"b\",\"c\"]}"));  /* maxItems */
    ck_assert(!acc(g, "{\"name\":\"Bo\",\"age\":7,\"x\":1}"));   /* additional */
    ck_assert(!acc(g, "{\"name\":3,\"age\":7}"));
    rlai_grammar_unref(g);

    g = schema("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"boolean\"},\"b\":{\"type\":\"null\"},"
               "\"c\":{\"type\":\"number\"}}}");   /* nothing required */
    ck_assert(acc(g, "{}"));
    ck_assert(acc(g, "{\"b\":null}"));
    ck_assert(acc(g, "{\"a\":true,\"c\":1.25e-3}"));
    ck_assert(!acc(g, "{,\"b\":null}"));
    ck_assert(!acc(g, "{\"a\":true,}"));
    ck_assert(!acc(g, "{\"a\":1}"));
    rlai_grammar_unref(g);

    g = schema("{\"enum\":[\"red\",\"green\",3,null]}");
    ck_assert(acc(g, "\"red\""));
    ck_assert(acc(g, "3"));
    ck_assert(acc(g, "null"));
    ck_assert(!acc(g, "\"blue\""));
    ck_assert(!acc(g, "\"re\""));
    rlai_grammar_unref(g);

    g = schema("{\"const\":{\"k\":[1,\"x\"]}}");
    ck_assert(acc(g, "{\"k\":[1,\"x\"]}"));
    ck_assert(!acc(g, "{\"k\":[1]}"));
    rlai_grammar_unref(g);

    g = schema("{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"object\","
               "\"properties\":{\"x\":{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}},\"required\":[\"x\"]}]},"
               "\"minItems\":2}");
    ck_assert(acc(g, "[1,2]"));
    ck_assert(acc(g, "[1,{\"x\":\"ab\"},{\"x\":\"\xc3\xa9\\n\\u0041\"}]"));
    ck_assert(!acc(g, "[1]"));
    ck_assert(!acc(g, "[1,{\"x\":\"a\"}]"));
    ck_assert(!acc(g, "[1,{\"x\":\"abcd\"}]"));
    rlai_grammar_unref(g);

    g = schema("{\"type\":[\"string\",\"null\"]}");
    ck_assert(acc(g, "\"s\""));
    ck_assert(acc(g, "null"));
    ck_assert(!acc(g, "1"));
    rlai_grammar_unref(g);

    /* $ref into $defs, recursive */
    g = schema("{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
               "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"v\"],"
               "\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}");
    ck_assert(acc(g, "{\"v\":1,\"kids\":[{\"v\":2},{\"v\":3,\"kids\":[{\"v\":4}]}]}"));
    ck_assert(!acc(g, "{\"v\":1,\"kids\":[{}]}"));
    rlai_grammar_unref(g);

    g = schema("{\"definitions\":{\"c\":{\"enum\":[\"a\",\"b\"]}},\"type\":\"object\","
               "\"properties\":{\"c\":{\"$ref\":\"#/definitions/c\",\"description\":\"d\"}},\"required\":[\"c\"]}");
    ck_assert(acc(g, "{\"c\":\"b\"}"));
    ck_assert(!acc(g, "{\"c\":\"z\"}"));
    rlai_grammar_unref(g);

    /* {} and true: any JSON value */
    g = schema("{}");
    ck_assert(acc(g, "[1,{\"a\":null}]"));
    ck_assert(acc(g, "\"x\""));
    rlai_grammar_unref(g);

    /* or-text (tool_choice auto): a call, or text not starting with '{' */
    const char *call = "{\"properties\":{\"name\":{\"const\":\"f\"}},\"required\":[\"name\"]}";
    ck_assert_int_eq(rlai_grammar_from_json_schema_flags(call, strlen(call), RLAI_GRAMMAR_OR_TEXT, &g, NULL, 0), 0);
    ck_assert(acc(g, "{\"name\":\"f\"}"));
    ck_assert(acc(g, "\n {\"name\":\"f\"}"));
    ck_assert(acc(g, "Hello {\"name\":\"g\"} \xff"));
    ck_assert(acc(g, ""));
    ck_assert(!acc(g, "{\"name\":\"g\"}"));
    ck_assert(!acc(g, " hello"));
    rlai_grammar_unref(g);

    /* nested $defs (tool parameters inside a wrapper) resolve in their own scope */
    g = schema("{\"properties\":{\"args\":{\"$defs\":{\"u\":{\"enum\":[\"c\",\"f\"]}},\"properties\":"
               "{\"unit\":{\"$ref\":\"#/$defs/u\"}},\"required\":[\"unit\"]}},\"required\":[\"args\"]}");
    ck_assert(acc(g, "{\"args\":{\"unit\":\"f\"}}"));
    ck_assert(!acc(g, "{\"args\":{\"unit\":\"k\"}}"));
    rlai_grammar_unref(g);

    /* property names are escaped */
    g = schema("{\"properties\":{\"a\\\"b\":{\"type\":\"integer\"}},\"required\":[\"a\\\"b\"]}");
    ck_assert(acc(g, "{\"a\\\"b\":1}"));
    rlai_grammar_unref(g);
}
END_TEST

static void refused(const char *s, int code, const char *needle)
{
    rlai_grammar *g = (rlai_grammar *)1;
    char err[256] = "";
    int rc = rlai_grammar_from_json_schema(s, strlen(s), &g, err, sizeof(err));
    ck_assert_msg(rc == code, "schema %s: rc %d want %d (%s)", s, rc, code, err);
    ck_assert_ptr_null(g);
    ck_assert_msg(strstr(err, needle), "schema %s: message '%s' lacks '%s'", s, err, needle);
}

START_TEST(schema_refusals)
{
    refused("{\"type\":\"string\",\"pattern\":\"^a|b$\"}", RLAI_ERR_UNSUPPORTED, "beside a '|'");
    refused("{\"type\":\"string\",\"pattern\":\"(?=a)\"}", RLAI_ERR_UNSUPPORTED, "lookaround");
    refused("{\"type\":\"string\",\"pattern\":\"(?<=a)b\"}", RLAI_ERR_UNSUPPORTED, "lookaround");
    refused("{\"type\":\"string\",\"pattern\":\"(?i)a\"}", RLAI_ERR_UNSUPPORTED, "inline flag");
    refused("{\"type\":\"string\",\"pattern\":\"(?<a-b>x)\"}", RLAI_ERR_UNSUPPORTED, "group name");
    refused("{\"type\":\"string\",\"pattern\":\"[\\\\u00e9]\"}", RLAI_ERR_UNSUPPORTED, "non-ASCII character in a class");
    refused("{\"type\":\"string\",\"pattern\":\"\\\\ud800\"}", RLAI_ERR_UNSUPPORTED, "surrogate");
    refused("{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", RLAI_ERR_UNSUPPORTED, "this escape");
    refused("{\"type\":\"string\",\"pattern\":\"[]\"}", RLAI_ERR_UNSUPPORTED, "an empty class");
    refused("{\"type\":\"string\",\"pattern\":\"a**\"}", RLAI_ERR_UNSUPPORTED, "after a quantifier");
    refused("{\"type\":\"string\",\"pattern\":\"^(a*)*$\"}", RLAI_ERR_UNSUPPORTED, "can match nothing");
    refused("{\"type\":\"string\",\"pattern\":\"(|x)+\"}", RLAI_ERR_UNSUPPORTED, "can match nothing");
    refused("{\"type\":\"string\",\"pattern\":\"(a\"}", RLAI_ERR_UNSUPPORTED, "without its ')'");
    refused("{\"type\":\"string\",\"pattern\":\"a$b\"}", RLAI_ERR_UNSUPPORTED, "an anchor inside");
    refused("{\"type\":\"string\",\"pattern\":\"[é]\"}", RLAI_ERR_UNSUPPORTED, "non-ASCII character in a class");
    refused("{\"type\":\"string\",\"pattern\":\"a{2000}\"}", RLAI_ERR_TOO_LARGE, "count above");
    refused("{\"type\":\"string\",\"pattern\":\"a\",\"maxLength\":3}", RLAI_ERR_UNSUPPORTED, "with minLength");
    refused("{\"type\":\"string\",\"pattern\":\"^[a-z]{3}[0-9]+$\",\"maxLength\":3}", RLAI_ERR_UNSUPPORTED,
            "4 to any number");
    refused("{\"type\":\"string\",\"pattern\":\"^a*b*c*$\",\"maxLength\":2}", RLAI_ERR_UNSUPPORTED,
            "its share of maxLength");
    refused("{\"type\":\"string\",\"pattern\":\"^[A-Z]+$\",\"minLength\":3}", RLAI_ERR_UNSUPPORTED, "1 to any number");
    refused("{\"type\":\"string\",\"pattern\":\"^a$\",\"format\":\"email\"}", RLAI_ERR_UNSUPPORTED, "with format");
    refused("{\"type\":\"string\",\"pattern\":3}", RLAI_ERR_INVALID_ARG, "must be a string");
    refused("{\"type\":\"number\",\"minimum\":1e-40}", RLAI_ERR_UNSUPPORTED, "at most 32 fraction digits");
    refused("{\"type\":\"number\",\"minimum\":2.5,\"exclusiveMaximum\":2.5}", RLAI_ERR_INVALID_ARG, "no number");
    refused("{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", RLAI_ERR_INVALID_ARG, "no integer");
    refused("{\"type\":\"integer\",\"exclusiveMinimum\":4,\"exclusiveMaximum\":5}", RLAI_ERR_INVALID_ARG, "no integer");
    refused("{\"type\":\"integer\",\"minimum\":1e17}", RLAI_ERR_INVALID_ARG, "at most 16 digits");
    refused("{\"type\":\"number\",\"minimum\":3,\"exclusiveMaximum\":3}", RLAI_ERR_INVALID_ARG, "no number");
    refused("{\"type\":\"integer\",\"minimum\":\"3\"}", RLAI_ERR_INVALID_ARG, "'minimum' must be a number");
    refused("{\"type\":\"integer\",\"not\":{\"const\":3}}", RLAI_ERR_UNSUPPORTED, "'not'");
    refused("{\"allOf\":[{\"type\":\"integer\"},{\"minimum\":3}]}", RLAI_ERR_UNSUPPORTED, "more than one constraining");
    refused("{\"allOf\":[{\"type\":\"integer\"}],\"type\":\"integer\"}", RLAI_ERR_UNSUPPORTED, "sibling keyword 'type'");
    refused("{\"allOf\":[]}", RLAI_ERR_INVALID_ARG, "non-empty array");
    refused("{\"prefixItems\":[{\"type\":\"integer\"}],\"items\":false,\"minItems\":2}", RLAI_ERR_INVALID_ARG,
            "minItems is greater than the items the tuple allows");
    refused("{\"items\":false,\"minItems\":1}", RLAI_ERR_INVALID_ARG, "greater than the items the array allows");
    refused("{\"prefixItems\":{}}", RLAI_ERR_INVALID_ARG, "'prefixItems' must be an array");
    refused("{\"type\":\"string\",\"format\":\"uuid\",\"maxLength\":3}", RLAI_ERR_UNSUPPORTED, "with minLength or maxLength");
    refused("{\"type\":\"string\",\"format\":\"email\",\"minLength\":8}", RLAI_ERR_UNSUPPORTED, "6 to 252 characters");
    refused("{\"type\":\"string\",\"format\":\"uri\",\"maxLength\":20}", RLAI_ERR_UNSUPPORTED, "with minLength or maxLength");
    refused("{\"type\":\"string\",\"maxLength\":16777217}", RLAI_ERR_TOO_LARGE, "above 16777216");
    refused("{\"type\":\"array\",\"maxItems\":1025}", RLAI_ERR_TOO_LARGE, "above 1024");
    refused("{\"type\":\"object\",\"properties\":{\"a\":{\"not\":{}}}}", RLAI_ERR_UNSUPPORTED, "'not'");
    refused("{\"type\":\"object\"", RLAI_ERR_INVALID_ARG, "not valid JSON");
    refused("[1]", RLAI_ERR_INVALID_ARG, "must be a JSON object");
    refused("{\"type\":\"thing\"}", RLAI_ERR_INVALID_ARG, "unknown JSON Schema type 'thing'");
    refused("{\"$ref\":\"#/$defs/missing\"}", RLAI_ERR_INVALID_ARG, "not found");
    refused("{\"$ref\":\"http://x/y\"}", RLAI_ERR_INVALID_ARG, "not found");
    refused("{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", RLAI_ERR_INVALID_ARG, "minItems");
    refused("{\"type\":\"array\",\"maxItems\":100000}", RLAI_ERR_TOO_LARGE, "maxItems");
    refused("{\"type\":\"string\",\"maxLength\":-1}", RLAI_ERR_INVALID_ARG, "maxLength");
    refused("{\"type\":\"array\",\"minItems\":4.44e63}", RLAI_ERR_TOO_LARGE, "'minItems' above");   /* was UB */
    refused("{\"type\":\"array\",\"maxItems\":2.5}", RLAI_ERR_INVALID_ARG, "non-negative integer");
    refused("{\"properties\":{\"a\":{}},\"required\":[\"b\"]}", RLAI_ERR_UNSUPPORTED, "'b'");
    refused("false", RLAI_ERR_UNSUPPORTED, "false");
    refused("{\"enum\":[]}", RLAI_ERR_INVALID_ARG, "enum");
    /* deep nesting is refused, not a stack overflow */
    char deep[2000] = "";
    for (int i = 0; i < 100; i++)
        strcat(deep, "{\"items\":");
    strcat(deep, "{}");
    for (int i = 0; i < 100; i++)
        strcat(deep, "}");
    refused(deep, RLAI_ERR_TOO_LARGE, "deeper");
    rlai_grammar *g = NULL;
    ck_assert_int_eq(rlai_grammar_from_json_schema(NULL, 0, &g, NULL, 0), RLAI_ERR_INVALID_ARG);
    ck_assert_int_eq(rlai_grammar_from_json_schema("{}", 2, NULL, NULL, 0), RLAI_ERR_INVALID_ARG);
    rlai_grammar_unref(NULL);
}
END_TEST

/* Writes into buf {"anyOf": [12 x {"anyOf": [12 strings of maxLength 1..144]}]}
 * (as an array's items when in_array): 144 heads once a string opens. */
static void nested_anyof_144(char *buf, size_t cap, bool in_array)
{
    size_t o = (size_t)snprintf(buf, cap, "%s{\"anyOf\":[", in_array ? "{\"type\":\"array\",\"items\":" : "");
    for (int i = 0; i < 12; i++) {
        o += (size_t)snprintf(buf + o, cap - o, "%s{\"anyOf\":[", i ? "," : "");
        for (int j = 0; j < 12; j++)
            o += (size_t)snprintf(buf + o, cap - o, "%s{\"type\":\"string\",\"maxLength\":%d}", j ? "," : "",
                                  i * 12 + j + 1);
        o += (size_t)snprintf(buf + o, cap - o, "]}");
    }
    snprintf(buf + o, cap - o, "]}%s", in_array ? "}" : "");
}

/* enum / const values go through a prefix tree: every value of a long enum
 * is reachable (the matcher keeps at most 128 heads, and one head per value
 * used to lose all values past the 128th without a word), values that are
 * prefixes of others and duplicates work, and nothing else is accepted. */
/* Schemas with texts each must accept and texts each must refuse. */
typedef struct texts_case {
    const char *sch;
    const char *yes[6], *no[6];
} texts_case;

static void check_texts(const texts_case *cs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        rlai_grammar *g = schema(cs[i].sch);
        for (int k = 0; k < 6 && cs[i].yes[k]; k++)
            ck_assert_msg(acc(g, cs[i].yes[k]), "%s refused %s", cs[i].sch, cs[i].yes[k]);
        for (int k = 0; k < 6 && cs[i].no[k]; k++)
            ck_assert_msg(!acc(g, cs[i].no[k]), "%s accepted %s", cs[i].sch, cs[i].no[k]);
        rlai_grammar_unref(g);
    }
}

/* Tuples (prefixItems; the items array and additionalItems of older
 * drafts) and allOf of one schema. */
START_TEST(schema_tuples_and_all_of)
{
    static const texts_case cases[] = {
        { "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"},{\"type\":\"string\"}],\"minItems\":2,\"maxItems\":2}",
          { "[1,\"a\"]", "[ 1 , \"a\" ]" }, { "[1]", "[\"a\",1]", "[1,\"a\",2]", "[]" } },
        { "{\"prefixItems\":[{\"type\":\"integer\"},{\"type\":\"string\"}]}",
          { "[]", "[1]", "[1,\"a\"]", "[1,\"a\",true,null]" }, { "[\"a\"]", "[1,2]" } },
        { "{\"prefixItems\":[{\"type\":\"integer\"},{\"type\":\"string\"}],\"items\":false}",
          { "[]", "[1]", "[1,\"a\"]" }, { "[1,\"a\",3]" } },
        { "{\"prefixItems\":[{\"type\":\"integer\"},{\"type\":\"string\"}],\"items\":{\"type\":\"boolean\"},\"minItems\":3}",
          { "[1,\"a\",true]", "[1,\"a\",true,false]" }, { "[1,\"a\"]", "[1,\"a\",1]" } },
        { "{\"prefixItems\":[{\"type\":\"integer\"},{\"type\":\"string\"},{\"type\":\"boolean\"}],\"minItems\":1,\"maxItems\":2}",
          { "[1]", "[1,\"a\"]" }, { "[]", "[1,\"a\",true]" } },
        { "{\"items\":[{\"type\":\"integer\"},{\"type\":\"string\"}],\"additionalItems\":false}",
          { "[1,\"a\"]", "[1]" }, { "[1,\"a\",3]" } },
        { "{\"items\":false}", { "[]", "[ ]" }, { "[1]" } },
        { "{\"$defs\":{\"P\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":3}},\"type\":\"object\","
          "\"properties\":{\"p\":{\"allOf\":[{\"$ref\":\"#/$defs/P\"}],\"description\":\"x\"}},\"required\":[\"p\"]}",
          { "{\"p\":2}" }, { "{\"p\":4}", "{}" } },
        { "{\"allOf\":[{\"description\":\"a\"},{\"type\":\"boolean\"},true]}", { "true" }, { "1" } },
        { "{\"allOf\":[{}]}", { "1", "{\"a\":[]}" }, { "{" } },
    };
    check_texts(cases, sizeof cases / sizeof *cases);
}
END_TEST

/* uniqueItems: items of an enum (through a $ref, as Pydantic writes
 * set[SomeEnum]) at most once each, in any order, within minItems and
 * maxItems; false, or maxItems 1, changes nothing. */
START_TEST(unique_items_of_enums)
{
    static const texts_case cases[] = {
        { "{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\",\"c\",\"a\"]},\"uniqueItems\":true}",
          { "[]", "[\"a\"]", "[\"c\",\"a\"]", "[\"b\", \"c\", \"a\"]" },
          { "[\"a\",\"a\"]", "[\"a\",\"b\",\"a\"]", "[\"d\"]", "[\"a\",\"b\",\"c\",\"a\"]" } },
        { "{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\",\"c\"]},\"uniqueItems\":true,\"minItems\":2,\"maxItems\":2}",
          { "[\"b\",\"a\"]", "[\"c\",\"b\"]" }, { "[\"a\"]", "[\"a\",\"b\",\"c\"]", "[\"b\",\"b\"]", "[]" } },
        { "{\"$defs\":{\"C\":{\"enum\":[\"r\",\"g\"],\"type\":\"string\",\"title\":\"C\"}},\"type\":\"array\","
          "\"items\":{\"$ref\":\"#/$defs/C\"},\"uniqueItems\":true}",
          { "[\"g\",\"r\"]", "[\"r\"]" }, { "[\"r\",\"r\"]", "[\"g\",\"r\",\"g\"]" } },
        { "{\"items\":{\"enum\":[1,2,3,4,5,6,7,8,9,10,11,12]},\"uniqueItems\":true}",
          { "[1,2,3,4,5,6,7,8,9,10,11,12]", "[12,11,10,9,8,7,6,5,4,3,2,1]", "[7]" },
          { "[1,2,3,4,5,6,7,8,9,10,11,12,1]", "[5,5]", "[13]" } },
        { "{\"type\":\"array\",\"items\":{\"const\":{\"k\":[1]}},\"uniqueItems\":true}", { "[]", "[{\"k\":[1]}]" },
          { "[{\"k\":[1]},{\"k\":[1]}]" } },
        { "{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"uniqueItems\":false}", { "[\"a\",\"a\"]" }, { "[1]" } },
        { "{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"uniqueItems\":true,\"maxItems\":1}", { "[\"x\"]", "[]" },
          { "[\"x\",\"y\"]" } },
        { "{\"type\":[\"array\",\"null\"],\"items\":{\"enum\":[true,false]},\"uniqueItems\":true}",
          { "null", "[true,false]", "[false]" }, { "[true,true]" } },
    };
    check_texts(cases, sizeof cases / sizeof *cases);
    refused("{\"type\":\"array\",\"items\":{\"type\":\"string\",\"pattern\":\"^a+$\"},\"uniqueItems\":true}",
            RLAI_ERR_UNSUPPORTED, "for strings without a pattern or format (set[str])");
    refused("{\"items\":{\"type\":\"string\",\"format\":\"date\"},\"uniqueItems\":true}", RLAI_ERR_UNSUPPORTED,
            "not for other items (use a list)");
    refused("{\"items\":{\"type\":\"integer\"},\"uniqueItems\":true}", RLAI_ERR_UNSUPPORTED, "set[str]");
    refused("{\"uniqueItems\":true}", RLAI_ERR_UNSUPPORTED, "'uniqueItems' is supported for strings");
    refused("{\"items\":{\"enum\":[1,2,3,4,5,6,7,8,9,10,11,12,13]},\"uniqueItems\":true}", RLAI_ERR_UNSUPPORTED,
            "more than 12 values");
    refused("{\"items\":{\"enum\":[1,2,3]},\"uniqueItems\":true,\"minItems\":4}", RLAI_ERR_INVALID_ARG,
            "greater than the 3 distinct values");
    refused("{\"items\":{\"enum\":[]},\"uniqueItems\":true}", RLAI_ERR_INVALID_ARG, "non-empty array");
    refused("{\"uniqueItems\":\"yes\"}", RLAI_ERR_INVALID_ARG, "must be a boolean");
    refused("{\"prefixItems\":[{\"enum\":[1]}],\"uniqueItems\":true}", RLAI_ERR_UNSUPPORTED, "with a tuple");
}
END_TEST

/* uniqueItems over plain strings (Pydantic's set[str] / frozenset[str]):
 * no two items with the same value, however each is written (UTF-8, a
 * short escape or \\u escapes), with minItems / maxItems / minLength;
 * whitespace between items as in any array. */
START_TEST(unique_items_of_strings)
{
    static const texts_case cases[] = {
        { "{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"uniqueItems\":true}",
          { "[]", "[ ]", "[\"a\",\"b\"]", "[ \"ab\" ,\n\"a\" , \"\"]", "[\"\\ud83d\",\"\\ud83d\\ude00\"]",
            "[\"x\",\"y\",\"z\",\"w\",\"xy\"]" },
          { "[\"a\",\"a\"]", "[\"a\",\"\\u0061\"]", "[\"\u00e9\",\"\\u00E9\"]", "[\"\\n\",\"\\u000a\"]",
            "[\"\U0001F600\",\"\\ud83d\\ude00\"]", "[\"a\",\"b\",\"a\"]" } },
        { "{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"uniqueItems\":true}",
          { "[\"/\",\"\\\"\"]", "[\"\\\\\",\"\\\\\\\\\"]" },
          { "[\"\\/\",\"/\"]", "[\"\\\"\",\"\\u0022\"]", "[\"a\",]", "[\"a\" \"b\"]", "[,\"a\"]", "[\"\",\"\"]" } },
        { "{\"$defs\":{\"Tag\":{\"type\":\"string\",\"minLength\":2,\"title\":\"Tag\"}},\"type\":\"array\","
          "\"items\":{\"$ref\":\"#/$defs/Tag\"},\"uniqueItems\":true,\"minItems\":1,\"maxItems\":3}",
          { "[\"ab\"]", "[\"ab\",\"abc\",\"ba\"]", "[\"\\u0061b\",\"ba\"]" },
          { "[]", "[\"a\"]", "[\"ab\",\"a\\u0062\"]", "[\"ab\",\"cd\",\"ef\",\"gh\"]" } },
        { "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},"
          "\"uniqueItems\":true},\"b\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"uniqueItems\":true}},"
          "\"required\":[\"a\",\"b\"]}",
          { "{\"a\":[\"x\",\"y\"],\"b\":[\"x\",\"y\"]}", "{\"a\":[],\"b\":[\"x\"]}" },
          { "{\"a\":[\"x\",\"x\"],\"b\":[]}", "{\"a\":[\"x\"],\"b\":[\"y\",\"y\"]}" } },
        /* maxLength: the last character may not make an earlier item */
        { "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":2},\"uniqueItems\":true}",
          { "[\"a\",\"ab\",\"b\"]", "[\"ab\",\"a\\u0063\"]", "[\"\\ud83d\\ude00\",\"\\ud83d\"]" },
          { "[\"ab\",\"ab\"]", "[\"abc\"]", "[\"ab\",\"a\\u0062\"]", "[\"x\",\"\\u0078\"]" } },
        { "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":0},\"uniqueItems\":true}",
          { "[]", "[\"\"]" }, { "[\"\",\"\"]", "[\"a\"]" } },
    };
    check_texts(cases, sizeof cases / sizeof *cases);
    refused("{\"items\":{\"type\":\"string\",\"minLength\":3,\"maxLength\":2},\"uniqueItems\":true}",
            RLAI_ERR_INVALID_ARG, "minLength is greater than maxLength");
    refused("{\"items\":{\"type\":\"string\",\"maxLength\":0},\"uniqueItems\":true,\"minItems\":2}",
            RLAI_ERR_INVALID_ARG, "the 1 distinct string of maxLength 0");

}
END_TEST

/* String text is exact: UTF-8 without overlong forms, surrogates or
 * code points past U+10FFFF (a model can write any byte), and a \u
 * surrogate pair is one character for minLength / maxLength, as the
 * 4-byte UTF-8 form is; lone surrogates count one each. Before
 * 2026-12-07 "\xE0\x80\x80" passed (in patterns' classes too), and
 * "\ud83d\ude00" was two. */
START_TEST(string_text_is_exact)
{
    static const texts_case cases[] = {
        { "{\"type\":\"string\"}",
          { "\"\xC3\xA9\"", "\"\xF0\x9F\x98\x80\"", "\"\\ud83d\\ude00\"", "\"\\ud83d\"", "\"\xED\x9F\xBF\"",
            "\"\xF4\x8F\xBF\xBF\"" },
          { "\"\xE0\x80\x80\"", "\"\xED\xA0\x80\"", "\"\xF4\x90\x80\x80\"", "\"\xC0\x80\"", "\"\xF0\x80\x80\x80\"",
            "\"\xF5\x80\x80\x80\"" } },
        { "{\"type\":\"string\",\"minLength\":2}",
          { "\"\\ud83d\\ud83d\"", "\"\\ud83da\"", "\"\\ude00\\ud83d\"", "\"\\ud83d\\ude00a\"" },
          { "\"\\ud83d\\ude00\"", "\"\xF0\x9F\x98\x80\"", "\"\\uD83D\\uDE00\"" } },
        { "{\"type\":\"string\",\"maxLength\":1}",
          { "\"\\ud83d\\ude00\"", "\"\xF0\x9F\x98\x80\"", "\"\\ud83d\"", "\"\\udbff\\udfff\"" },
          { "\"\\ud83d\\ud83d\"", "\"\\ud83d\\n\"", "\"\\ud83da\"", "\"\\ud83d\\u0061\"" } },
        { "{\"type\":\"string\",\"pattern\":\"a\"}", { "\"a\\ud83d\"", "\"\\ud83d\\ude00a\"" }, { "\"b\\ud83d\"" } },
        { "{\"type\":\"string\",\"pattern\":\"^[^a]$\"}", { "\"\xC3\xA9\"", "\"\xF0\x9F\x98\x80\"", "\"\xED\x9F\xBF\"" },
          { "\"\xE0\x80\x80\"", "\"\xED\xA0\x80\"", "\"\xF4\x90\x80\x80\"", "\"a\"" } },
    };
    check_texts(cases, sizeof cases / sizeof *cases);
}
END_TEST

/* Pydantic's discriminated union: a oneOf of $refs with OpenAPI's
 * "discriminator" beside it (an annotation; it was a refusal). */
START_TEST(discriminated_union)
{
    static const texts_case cases[] = {
        { "{\"$defs\":{\"Cat\":{\"properties\":{\"pet_type\":{\"const\":\"cat\",\"type\":\"string\"},"
          "\"meows\":{\"type\":\"integer\"}},\"required\":[\"pet_type\",\"meows\"],\"type\":\"object\"},"
          "\"Dog\":{\"properties\":{\"pet_type\":{\"const\":\"dog\",\"type\":\"string\"},\"barks\":{\"type\":\"number\"}},"
          "\"required\":[\"pet_type\",\"barks\"],\"type\":\"object\"}},"
          "\"properties\":{\"pet\":{\"discriminator\":{\"mapping\":{\"cat\":\"#/$defs/Cat\",\"dog\":\"#/$defs/Dog\"},"
          "\"propertyName\":\"pet_type\"},\"oneOf\":[{\"$ref\":\"#/$defs/Cat\"},{\"$ref\":\"#/$defs/Dog\"}]}},"
          "\"required\":[\"pet\"],\"type\":\"object\"}",
          { "{\"pet\":{\"pet_type\":\"cat\",\"meows\":3}}", "{\"pet\":{\"pet_type\":\"dog\",\"barks\":1.5}}" },
          { "{\"pet\":{\"pet_type\":\"cat\",\"barks\":1.5}}", "{\"pet\":{\"pet_type\":\"cow\",\"meows\":1}}",
            "{\"pet\":{\"meows\":3}}" } },
    };
    check_texts(cases, sizeof cases / sizeof *cases);
}
END_TEST

/* minProperties / maxProperties (Pydantic's dict with min_length /
 * max_length): counted maps; beside properties only when they change
 * nothing; a map minimum above 1 is refused (keys are not kept apart). */
START_TEST(property_counts)
{
    static const texts_case cases[] = {
        { "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"},\"minProperties\":1,\"maxProperties\":2}",
          { "{\"a\":1}", "{\"a\":1,\"b\":2}", "{ \"a\" : 1 , \"b\" : 2 }" },
          { "{}", "{\"a\":1,\"b\":2,\"c\":3}", "{\"a\":\"x\"}" } },
        { "{\"type\":\"object\",\"minProperties\":1}", { "{\"a\":[1]}", "{\"a\":1,\"b\":{}}" }, { "{}", "[]" } },
        { "{\"type\":\"object\",\"maxProperties\":1}", { "{}", "{\"k\":null}" }, { "{\"a\":1,\"b\":2}" } },
        { "{\"maxProperties\":0}", { "{}" }, { "{\"a\":1}" } },
        { "{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\"},\"m\":{\"type\":\"integer\"}},"
          "\"required\":[\"n\"],\"minProperties\":1,\"maxProperties\":2}", { "{\"n\":1}", "{\"n\":1,\"m\":2}" }, { "{}" } },
    };
    check_texts(cases, sizeof cases / sizeof *cases);
    refused("{\"type\":\"object\",\"minProperties\":2}", RLAI_ERR_UNSUPPORTED, "keys are not kept apart");
    refused("{\"type\":\"object\",\"minProperties\":3,\"maxProperties\":2}", RLAI_ERR_INVALID_ARG, "greater than");
    refused("{\"type\":\"object\",\"minProperties\":1,\"additionalProperties\":false}", RLAI_ERR_INVALID_ARG, "no object");
    refused("{\"type\":\"object\",\"properties\":{\"n\":{}},\"minProperties\":1}", RLAI_ERR_UNSUPPORTED, "beside 'properties'");
    refused("{\"type\":\"object\",\"maxProperties\":-1}", RLAI_ERR_INVALID_ARG, "non-negative integer");
}
END_TEST

/* multipleOf: remainder grammars without bounds or with one bound at 0,
 * listed values between two bounds, steps of 10^-k over bounds as
 * fraction-digit caps; refusals name what is not supported. */
START_TEST(multiple_of)
{
    static const texts_case cases[] = {
        { "{\"type\":\"integer\",\"multipleOf\":5}", { "0", "5", "-15", "1000000", "123456789012345" },
          { "3", "05", "-0", "5.0", "1e1", "-7" } },
        { "{\"type\":\"number\",\"exclusiveMinimum\":0,\"multipleOf\":0.01}", { "0.01", "12.5", "12.34", "3", "0.10" },
          { "0", "0.00", "12.345", "-1", "0.001", "1." } },
        { "{\"type\":\"number\",\"minimum\":1,\"maximum\":5,\"multipleOf\":0.5}", { "1", "1.5", "4.5", "5" },
          { "0.5", "5.5", "1.50", "1.25", "-1" } },
        { "{\"type\":\"number\",\"multipleOf\":0.125}", { "0.125", "-2.375", "3", "0.5", "0" },
          { "0.1", "0.0625", "-0.12", "0.1250000" } },
        { "{\"type\":\"number\",\"minimum\":0,\"maximum\":1000000,\"multipleOf\":0.01}", { "0", "999999.99", "1000000", "0.5" },
          { "1000000.01", "-0.01", "0.001", "1000000.5" } },
        { "{\"type\":\"integer\",\"multipleOf\":2.5}", { "5", "-10", "0" }, { "2.5", "7" } },
        { "{\"type\":\"integer\",\"maximum\":0,\"multipleOf\":3}", { "0", "-3", "-300" }, { "3", "-1" } },
        { "{\"type\":\"number\",\"minimum\":-7,\"multipleOf\":2}", { "-6", "-2", "0", "8" }, { "-8", "-7", "3" } },
        { "{\"multipleOf\":4}", { "8", "-4" }, { "\"8\"", "6" } },
        { "{\"type\":[\"integer\",\"null\"],\"multipleOf\":10}", { "null", "20" }, { "25" } },
        { "{\"type\":\"number\",\"multipleOf\":0.3}", { "0.3", "0.9", "-1.2", "3" }, { "0.1", "1", "0.33" } },
    };
    check_texts(cases, sizeof cases / sizeof *cases);
    /* every multiple of 7 from -2000 to 2000 and nothing between */
    rlai_grammar *g = schema("{\"type\":\"integer\",\"multipleOf\":7}");
    char t[32];
    for (int i = -2000; i <= 2000; i++) {
        snprintf(t, sizeof t, "%d", i);
        ck_assert_msg(acc(g, t) == (i % 7 == 0), "%s accepted %d", t, acc(g, t));
    }
    rlai_grammar_unref(g);
    refused("{\"type\":\"integer\",\"multipleOf\":0}", RLAI_ERR_INVALID_ARG, "above 0");
    refused("{\"type\":\"integer\",\"multipleOf\":\"5\"}", RLAI_ERR_INVALID_ARG, "above 0");
    refused("{\"type\":\"number\",\"multipleOf\":1e-16}", RLAI_ERR_UNSUPPORTED, "fraction digits");
    refused("{\"type\":\"integer\",\"multipleOf\":7919}", RLAI_ERR_UNSUPPORTED, "more than 2048 rules");
    refused("{\"type\":\"integer\",\"minimum\":6,\"multipleOf\":5}", RLAI_ERR_UNSUPPORTED, "within one step of 0");
    refused("{\"type\":\"integer\",\"minimum\":0,\"maximum\":10000000,\"multipleOf\":7}", RLAI_ERR_UNSUPPORTED,
            "at most 20000 multiples");
    refused("{\"type\":\"integer\",\"minimum\":1,\"maximum\":4,\"multipleOf\":5}", RLAI_ERR_INVALID_ARG, "no multiple of 5");
}
END_TEST

/* Enforced string formats: every month/day pair, hours and minutes at
 * their edges, the other formats by example; other formats stay
 * annotations. */
START_TEST(string_formats)
{
    static const int mdays[13] = { 0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 };   /* 2024 */
    rlai_grammar *g = schema("{\"type\":\"string\",\"format\":\"date\"}");
    char t[64];
    for (int mo = 0; mo <= 13; mo++)
        for (int d = 0; d <= 32; d++) {
            snprintf(t, sizeof t, "\"2024-%02d-%02d\"", mo, d);
            bool ok = mo >= 1 && mo <= 12 && d >= 1 && d <= mdays[mo];
            ck_assert_msg(acc(g, t) == ok, "%s accepted %d", t, acc(g, t));
        }
    ck_assert(!acc(g, "\"0999-01-01\"") && acc(g, "\"1000-01-01\"") && !acc(g, "\"2024-1-01\""));
    /* February 29th: every year 1000-9999, by the Gregorian rule */
    for (int y = 1000; y <= 9999; y++) {
        bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
        snprintf(t, sizeof t, "\"%d-02-29\"", y);
        ck_assert_msg(acc(g, t) == leap, "%s accepted %d", t, acc(g, t));
    }
    ck_assert(!acc(g, "\"2024-02-30\"") && acc(g, "\"2023-02-28\""));
    rlai_grammar_unref(g);
    /* IPv6: eight groups, and every run of them written as "::" */
    g = schema("{\"type\":\"string\",\"format\":\"ipv6\"}");
    ck_assert(acc(g, "\"1:22:333:4444:a:bb:ccc:DDDD\""));
    for (int i = 0; i < 8; i++)
        for (int n = 1; i + n <= 8; n++) {
            int w = snprintf(t, sizeof t, "\"");
            for (int k = 0; k < i; k++)
                w += snprintf(t + w, sizeof t - (size_t)w, "%s%x", k ? ":" : "", k + 1);
            w += snprintf(t + w, sizeof t - (size_t)w, "::");
            for (int k = i + n; k < 8; k++)
                w += snprintf(t + w, sizeof t - (size_t)w, "%s%x", k > i + n ? ":" : "", k + 1);
            snprintf(t + w, sizeof t - (size_t)w, "\"");
            ck_assert_msg(acc(g, t), "%s refused", t);
        }
    rlai_grammar_unref(g);
    g = schema("{\"type\":\"string\",\"format\":\"date-time\"}");
    for (int h = 0; h <= 24; h++)
        for (int m = 0; m <= 60; m += 30) {
            snprintf(t, sizeof t, "\"2024-05-06T%02d:%02d:59Z\"", h, m == 30 ? 59 : m);
            bool ok = h <= 23 && m <= 30;
            ck_assert_msg(acc(g, t) == ok, "%s accepted %d", t, acc(g, t));
        }
    ck_assert(acc(g, "\"2024-05-06T23:59:59.123456+05:30\"") && acc(g, "\"2024-05-06T00:00:00-12:00\""));
    ck_assert(!acc(g, "\"2024-05-06T12:30:00\"") && !acc(g, "\"2024-05-06 12:30:00Z\"") &&
              !acc(g, "\"2024-05-06T12:30:00.1234567Z\""));
    rlai_grammar_unref(g);
    static const texts_case cases[] = {
        { "{\"type\":\"string\",\"format\":\"time\"}", { "\"08:15:00Z\"", "\"23:00:00.5+01:00\"" },
          { "\"08:15:00\"", "\"8:15:00Z\"" } },
        { "{\"type\":\"string\",\"format\":\"uuid\"}", { "\"123e4567-e89b-12d3-a456-426614174000\"", "\"ABCDEF00-0000-0000-0000-000000000000\"" },
          { "\"123e4567e89b12d3a456426614174000\"", "\"123e4567-e89b-12d3-a456-42661417400g\"" } },
        { "{\"type\":\"string\",\"format\":\"ipv4\"}", { "\"192.168.0.1\"", "\"0.0.0.0\"", "\"255.255.255.255\"" },
          { "\"256.1.1.1\"", "\"01.2.3.4\"", "\"1.2.3\"" } },
        { "{\"type\":\"string\",\"format\":\"ipv6\"}", { "\"::\"", "\"::1\"", "\"fe80::1:2\"", "\"2001:DB8::\"",
                                                       "\"1:2:3:4:5:6:7::\"", "\"::1:2:3:4:5:6:7\"" },
          { "\"1:2:3:4:5:6:7:8:9\"", "\"1::2::3\"", "\"1:2:3:4:5:6:7:8::\"", "\"12345::\"", "\":1::\"", "\"1:::2\"" } },
        { "{\"type\":\"string\",\"format\":\"ipv6\"}", { NULL },
          { "\"::1.2.3.4\"", "\"1:2:3:4:5:6:7\"", "\"::g\"", "\"\"", "\"1.2.3.4\"", "\"::1/64\"" } },
        { "{\"type\":\"string\",\"format\":\"ipvanyaddress\"}", { "\"10.0.0.1\"", "\"::1\"" },
          { "\"10.0.0.1/8\"", "\"::1/128\"", "\"x\"" } },
        { "{\"type\":\"string\",\"format\":\"ipvanyinterface\"}", { "\"10.0.0.1/8\"", "\"::1/128\"", "\"10.0.0.1\"",
                                                                  "\"192.168.1.7/32\"", "\"fe80::1/0\"" },
          { "\"10.0.0.1/33\"", "\"::1/129\"", "\"10.0.0.1/08\"", "\"10.0.0.1/\"" } },
        { "{\"type\":\"string\",\"format\":\"ipv4interface\"}", { "\"10.1.2.3/24\"" }, { "\"::1/64\"", "\"10.1.2.3/64\"" } },
        { "{\"type\":\"string\",\"format\":\"ipv6interface\"}", { "\"fe80::1/64\"" }, { "\"10.1.2.3/24\"" } },
        { "{\"type\":\"string\",\"format\":\"ipv6network\"}", { "\"x\"", "\"\"" }, { "1" } },   /* an annotation */
        { "{\"type\":\"string\",\"format\":\"email\"}",
          { "\"john.smith@example.com\"", "\"a@b.co\"", "\"o'brien+tag@mail.example.co.uk\"",
            "\"x_y-z@sub-domain.example.org\"", "\"A.B.C.D@x.io\"", "\"my--x@a--b.com\"" },
          { "\"john@example\"", "\"john..smith@x.com\"", "\".john@x.com\"", "\"john@-x.com\"",
            "\"john@x.c\"", "\"john smith@x.com\"" } },
        { "{\"type\":\"string\",\"format\":\"email\"}", { NULL },
          { "\"john.@x.com\"", "\"john@x-.com\"", "\"john@x.com1\"", "\"@x.com\"", "\"\"", "\"a.b.c.d.e@x.com\"" } },
        { "{\"type\":\"string\",\"format\":\"uri\"}",
          { "\"https://example.com\"", "\"http://localhost:8080/api/v1?x=1&y=2#top\"", "\"mailto:someone@example.com\"",
            "\"urn:isbn:0451450523\"", "\"ftp://192.168.0.1/pub/file.txt\"",
            "\"https://en.wikipedia.org/wiki/Dragon_(disambiguation)\"" },
          { "\"example.com\"", "\"http://\"", "\"http:///x\"", "\"https://exa mple.com\"", "\"http://x:0/\"",
            "\"http://x:99999/\"" } },
        { "{\"type\":\"string\",\"format\":\"uri\",\"minLength\":1,\"maxLength\":2083}",   /* Pydantic's HttpUrl */
          { "\"https://example.com/\"", "\"wss://a.b:443/x\"", "\"tel:+1-555-0100\"", "\"data:text/plain;base64,SGVsbG8=\"" },
          { "\"https://e.com/a b\"", "\"1http://x\"", "\"http:/x\"", "\"https://a.b.c.d.e.f.g.com\"",
            "\"https://e.com/%20\"", "\"https://e.com/\\\"x\"" } },
        { "{\"type\":\"string\",\"format\":\"uri\"}", { NULL },   /* schemes other than the well-known ones */
          { "\"https:example.com\"", "\"mailto://x\"", "\"coap://x\"", "\"moulin.com.:x\"", "\"x:y\"" } },
        { "{\"type\":\"string\",\"format\":\"hostname\"}",
          { "\"example.com\"", "\"a-b.c\"", "\"localhost\"", "\"my--company-name.co\"", "\"10.0.0.1\"" },
          { "\"-a.com\"", "\"a_b.com\"", "\"a..b\"", "\"a-.com\"", "\"a-b-c-d.com\"", "\"a.b.c.d.e.f\"" } },
        { "{\"type\":\"string\",\"format\":\"date\",\"minLength\":10,\"maxLength\":10}", { "\"2024-02-28\"" },
          { "\"2024-2-28\"" } },
        { "{\"type\":\"string\",\"maxLength\":5000}", { "\"abc\"" }, { "1" } },
        { "{\"type\":\"string\",\"format\":\"duration\"}",
          { "\"P1D\"", "\"PT1H\"", "\"P1DT2H30M5S\"", "\"P1W\"", "\"P2Y3M\"", "\"P1Y2M3DT4H5M6S\"" },
          { "\"PT\"", "\"P\"", "\"90\"", "\"P1DT\"", "\"PT1H5S\"", "\"P1W2D\"" } },
        { "{\"type\":\"string\",\"format\":\"duration\"}", { "\"PT90M\"" }, { "\"P1.5D\"", "\"P1M1Y\"", "\"P1234567D\"" } },
        { "{\"type\":[\"string\",\"null\"],\"format\":\"date\"}", { "null", "\"2020-01-31\"" }, { "\"x\"" } },
    };
    check_texts(cases, sizeof cases / sizeof *cases);
    /* under a maxLength, addresses and URIs of every shape: what is
     * accepted fits, and the common ones are accepted */
    static const int maxes[] = { 2083, 254, 120, 100, 64, 50, 40, 30 };
    static char txt[2300];
    for (size_t mi = 0; mi < sizeof maxes / sizeof *maxes; mi++) {
        char sch[160];
        int max = maxes[mi], fits = 0, taken = 0;
        snprintf(sch, sizeof sch, "{\"type\":\"string\",\"format\":\"uri\",\"maxLength\":%d}", max);
        rlai_grammar *gu = NULL;
        int rc = rlai_grammar_from_json_schema(sch, strlen(sch), &gu, NULL, 0);
        ck_assert_msg(rc == 0 || (rc == RLAI_ERR_UNSUPPORTED && max < 40), "uri maxLength %d: %d", max, rc);
        snprintf(sch, sizeof sch, "{\"type\":\"string\",\"format\":\"email\",\"maxLength\":%d}", max);
        rlai_grammar *ge = schema(sch);
        for (int host = 1; host <= 80; host += 7)
            for (int path = 0; path <= 1200; path += path < 40 ? 3 : 97)
                for (int q = 0; q <= 300; q += q < 20 ? 9 : 140) {
                    /* https://hhh.hh.com/ppp?qqq and local@hhh.hh.com */
                    int o = snprintf(txt, sizeof txt, "\"https://");
                    for (int k = 0; k < host; k++)
                        txt[o++] = k % 9 == 8 && k + 1 < host ? '.' : (char)('a' + k % 7);
                    o += snprintf(txt + o, sizeof txt - (size_t)o, ".com");
                    int h_end = o;
                    if (path)
                        for (int k = 0; k < path; k++)
                            txt[o++] = k % 11 == 0 ? '/' : (char)('m' + k % 5);
                    if (q) {
                        txt[o++] = '?';
                        for (int k = 1; k < q; k++)
                            txt[o++] = k % 6 ? (char)('0' + k % 10) : '=';
                    }
                    txt[o++] = '"';
                    txt[o] = 0;
                    int len = o - 2;
                    fits += len <= max;
                    if (gu && acc(gu, txt)) {
                        ck_assert_msg(len <= max, "uri of %d characters under maxLength %d", len, max);
                        taken++;
                    }
                    if (path == 0 && q == 0) {   /* the host as an address: "local@host" */
                        char em[200];
                        snprintf(em, sizeof em, "\"%.*s@%.*s\"", 1 + host % 13, "johnsmithsjohnsmith", h_end - 9, txt + 9);
                        if (acc(ge, em))
                            ck_assert_msg((int)strlen(em) - 2 <= max, "%s under maxLength %d", em, max);
                    }
                }
        ck_assert_msg(!gu || taken > 0 || fits == 0, "uri maxLength %d took none of %d that fit", max, fits);
        ck_assert(acc(ge, "\"a@b.co\""));
        ck_assert(max < 64 || acc(ge, "\"john.smith@example.com\""));
        ck_assert(!gu || max < 50 || acc(gu, "\"https://example.com\""));
        rlai_grammar_unref(gu);
        rlai_grammar_unref(ge);
    }
    /* strings past the 1024 of arrays (Pydantic writes maxLength 2083 for URLs) */
    rlai_grammar *gs = schema("{\"type\":\"string\",\"minLength\":1500,\"maxLength\":2000}");
    for (int n = 1499; n <= 2001; n++) {
        txt[0] = '"';
        memset(txt + 1, 'x', (size_t)n);
        txt[n + 1] = '"';
        txt[n + 2] = 0;
        ck_assert_int_eq(acc(gs, txt), n >= 1500 && n <= 2000);
        if (n == 1510)
            n = 1990;
    }
    rlai_grammar_unref(gs);
}
END_TEST

/* Patterns: each case's texts (JSON, as the matcher sees them) accepted
 * or refused; generated by Python's json.dumps from the strings, so the
 * escapes are JSON's own. */
START_TEST(string_patterns)
{
    static const texts_case cases[] = {
        { "{\"type\": \"string\", \"pattern\": \"^[A-Z]{3}-\\\\d{4}$\"}",
          { "\"ABC-1234\"" },
          { "\"AB-1234\"", "\"ABC-12345\"", "\"xABC-1234\"", "\"abc-1234\"" } },
        { "{\"type\": \"string\", \"pattern\": \"cat\"}",
          { "\"cat\"", "\"a cat!\"", "\"concatenate\"" },
          { "\"dog\"", "\"ca t\"" } },
        { "{\"type\": \"string\", \"pattern\": \"^(foo|ba[rz])+$\"}",
          { "\"foo\"", "\"barbazfoo\"" },
          { "\"fo\"", "\"\"", "\"foox\"" } },
        { "{\"type\": \"string\", \"pattern\": \"^\\\\+?[0-9 ()-]{7,15}$\"}",
          { "\"+1 (555) 123-456\"", "\"5551234\"" },
          { "\"555\"", "\"+1 (555) 123-4567\"" } },
        { "{\"type\": \"string\", \"pattern\": \"^a.c$\"}",
          { "\"abc\"", "\"a\\\"c\"", "\"a\\\\c\"", "\"a\xc3""\xa9""c\"", "\"a c\"" },
          { "\"a\\nc\"", "\"ac\"", "\"abbc\"" } },
        { "{\"type\": \"string\", \"pattern\": \"^say \\\"hi\\\"\\\\n?$\"}",
          { "\"say \\\"hi\\\"\"", "\"say \\\"hi\\\"\\n\"" },
          { "\"say hi\"" } },
        { "{\"type\": \"string\", \"pattern\": \"^[^a-z]*$\"}",
          { "\"ABC 1\"", "\"\xc3""\x84""\xc3""\x96""\"", "\"\"" },
          { "\"aB\"", "\"\\t\"" } },
        { "{\"type\": \"string\", \"pattern\": \"^\\\\w+@\\\\w+\\\\.com$\"}",
          { "\"bob@ex.com\"" },
          { "\"bob@ex.org\"", "\"@ex.com\"" } },
        { "{\"type\": \"string\", \"pattern\": \"^h\xc3""\xa9""llo \xf0""\x9f""\x90""\x89""$\"}",
          { "\"h\xc3""\xa9""llo \xf0""\x9f""\x90""\x89""\"" },
          { "\"hello \xf0""\x9f""\x90""\x89""\"" } },
        { "{\"type\": \"string\", \"pattern\": \"^x{2,}?$\"}",
          { "\"xx\"", "\"xxxx\"" },
          { "\"x\"" } },
        { "{\"type\": \"string\", \"pattern\": \"^\\\\s\\\\S\\\\D\\\\W$\"}",
          { "\" a\xc3""\xa9""!\"", "\"\\tbc-\"" },
          { "\"  a!\"", "\" a1!\"", "\" ab_\"" } },
        { "{\"type\": \"string\", \"pattern\": \"^(?:ab){2}c?$\"}",
          { "\"abab\"", "\"ababc\"" },
          { "\"ab\"", "\"abababc\"" } },
        /* with minLength / maxLength (2026-12-07; were refused): the
         * pattern's own length within them, an unbounded repetition
         * capped at what fits maxLength */
        { "{\"type\":\"string\",\"pattern\":\"^\\\\d{5}$\",\"minLength\":5,\"maxLength\":5}", { "\"12345\"" },
          { "\"1234\"", "\"123456\"" } },
        { "{\"type\":\"string\",\"pattern\":\"^[A-Z]+$\",\"maxLength\":10}", { "\"ABCDEFGHIJ\"", "\"A\"" },
          { "\"ABCDEFGHIJK\"", "\"\"" } },
        { "{\"type\":\"string\",\"pattern\":\"^v\\\\d+(\\\\.[0-9])?$\",\"maxLength\":9}", { "\"v123456\"", "\"v123456.7\"", "\"v1.2\"" },
          { "\"v12345678.9\"", "\"v\"" } },
        { "{\"type\":\"string\",\"pattern\":\"^[a-z]+(-[a-z]+)*$\",\"maxLength\":20}", { "\"abc-defg\"", "\"abcdefg\"" },
          { "\"abcdefghijklmnopqrstu\"", "\"-abc\"" } },
        /* named groups, \\xHH and \\uHHHH (2026-12-07; were refused) */
        { "{\"type\": \"string\", \"pattern\": \"^(?<year>\\\\d{4})-(?P<month>\\\\d{2})$\"}",
          { "\"2024-05\"" }, { "\"2024-5\"", "\"year-05\"" } },
        { "{\"type\": \"string\", \"pattern\": \"^[\\\\u0041-\\\\u005A]\\\\x2D\\\\u00e9$\"}",
          { "\"Q-\xc3\xa9\"" }, { "\"q-\xc3\xa9\"", "\"Q-e\"" } },
    };
    check_texts(cases, sizeof cases / sizeof *cases);
}
END_TEST

/* Bounded integers: every value of a window, and values around the
 * bounds far out, are accepted exactly when within the bounds; no leading
 * zeros, no "-0", no fraction or exponent. */
static void int_bounds(const char *sch, long long lo, long long hi)
{
    rlai_grammar *g = schema(sch);
    char t[40];
    for (long long v = -1100; v <= 1100; v++) {
        snprintf(t, sizeof t, "%lld", v);
        ck_assert_msg(acc(g, t) == (v >= lo && v <= hi), "%s: %s accepted %d", sch, t, acc(g, t));
    }
    long long edges[] = { lo - 1, lo, lo + 1, hi - 1, hi, hi + 1, 9999999999999999LL, -9999999999999999LL,
                          1000000000000000LL, 123456789012345LL, -98765432109876LL, 4999, 5000, 9999, 10000,
                          -9999, -10000, 99999, 100000, 1000000, 1000001 };
    for (size_t i = 0; i < sizeof edges / sizeof *edges; i++) {
        long long v = edges[i];
        if (v < -9999999999999999LL || v > 9999999999999999LL)
            continue;
        snprintf(t, sizeof t, "%lld", v);
        ck_assert_msg(acc(g, t) == (v >= lo && v <= hi), "%s: %s accepted %d", sch, t, acc(g, t));
    }
    ck_assert_msg(!acc(g, "10000000000000000"), "%s: 17 digits", sch);
    ck_assert(!acc(g, "-0") && !acc(g, "1.0") && !acc(g, "1e2"));
    if (lo <= 7 && 7 <= hi)
        ck_assert(acc(g, "7") && !acc(g, "07") && !acc(g, "007"));
    rlai_grammar_unref(g);
}

#define NOLO (-9999999999999999LL)
#define NOHI 9999999999999999LL

START_TEST(numeric_bounds_integers)
{
    int_bounds("{\"type\":\"integer\",\"minimum\":-123,\"maximum\":4567}", -123, 4567);
    int_bounds("{\"type\":\"integer\",\"minimum\":0,\"maximum\":0}", 0, 0);
    int_bounds("{\"type\":\"integer\",\"minimum\":5,\"maximum\":5}", 5, 5);
    int_bounds("{\"type\":\"integer\",\"minimum\":-10,\"maximum\":-3}", -10, -3);
    int_bounds("{\"type\":\"integer\",\"minimum\":0,\"maximum\":100}", 0, 100);
    int_bounds("{\"type\":\"integer\",\"minimum\":1}", 1, NOHI);
    int_bounds("{\"type\":\"integer\",\"maximum\":99}", NOLO, 99);
    int_bounds("{\"type\":\"integer\",\"maximum\":-5}", NOLO, -5);
    int_bounds("{\"type\":\"integer\",\"minimum\":-50}", -50, NOHI);
    int_bounds("{\"type\":\"integer\",\"minimum\":1000,\"maximum\":1000000}", 1000, 1000000);
    int_bounds("{\"type\":\"integer\",\"minimum\":199,\"maximum\":3001}", 199, 3001);
    int_bounds("{\"type\":\"integer\",\"minimum\":123456789012345,\"maximum\":9999999999999999}", 123456789012345LL,
               NOHI);
    int_bounds("{\"type\":\"integer\",\"minimum\":-98765432109876,\"maximum\":-98765432109000}", -98765432109876LL,
               -98765432109000LL);
    /* exclusive (2020-12 numbers, draft-4 booleans), fractional bounds, both kinds at once */
    int_bounds("{\"type\":\"integer\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":10}", 1, 9);
    int_bounds("{\"type\":\"integer\",\"minimum\":0,\"exclusiveMinimum\":true,\"maximum\":10,\"exclusiveMaximum\":true}", 1, 9);
    int_bounds("{\"type\":\"integer\",\"minimum\":-2.5,\"maximum\":7.9}", -2, 7);
    int_bounds("{\"type\":\"integer\",\"minimum\":-5,\"exclusiveMinimum\":-3,\"maximum\":8,\"exclusiveMaximum\":20}", -2, 8);
    int_bounds("{\"type\":\"integer\",\"maximum\":1e20,\"minimum\":-1e20}", NOLO, NOHI);
}
END_TEST

/* Bounded numbers: sign, integer part and fraction against the value
 * (as a validator compares it: the text's double against the bound's). */
static void num_bounds(const char *sch, bool hl, double lo, bool sl, bool hh, double hi, bool sh)
{
    rlai_grammar *g = schema(sch);
    static const char *fr[] = { "", ".0", ".00", ".5", ".05", ".000001", ".999", ".10", ".25", ".2499", ".2501",
                                ".75", ".3", ".29", ".7", ".70001" };
    char t[48];
    for (int k = 0; k <= 12; k++)
        for (size_t f = 0; f < sizeof fr / sizeof *fr; f++)
            for (int neg = 0; neg < 2; neg++) {
                snprintf(t, sizeof t, "%s%d%s", neg ? "-" : "", k, fr[f]);
                double v = strtod(t, NULL);
                bool in = (!hl || (sl ? v > lo : v >= lo)) && (!hh || (sh ? v < hi : v <= hi));
                ck_assert_msg(acc(g, t) == in, "%s: %s accepted %d", sch, t, acc(g, t));
            }
    ck_assert(!acc(g, "1e0") && !acc(g, "01") && !acc(g, "1.") && !acc(g, ".5"));
    rlai_grammar_unref(g);
}

START_TEST(numeric_bounds_numbers)
{
    num_bounds("{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", true, 0, false, true, 1, false);
    num_bounds("{\"type\":\"number\",\"exclusiveMinimum\":0,\"maximum\":1}", true, 0, true, true, 1, false);
    num_bounds("{\"type\":\"number\",\"minimum\":-2,\"exclusiveMaximum\":3}", true, -2, false, true, 3, true);
    num_bounds("{\"type\":\"number\",\"maximum\":0}", false, 0, false, true, 0, false);
    num_bounds("{\"type\":\"number\",\"exclusiveMaximum\":0}", false, 0, false, true, 0, true);
    num_bounds("{\"type\":\"number\",\"minimum\":5}", true, 5, false, false, 0, false);
    num_bounds("{\"type\":\"number\",\"exclusiveMinimum\":5}", true, 5, true, false, 0, false);
    num_bounds("{\"type\":\"number\",\"minimum\":-7,\"maximum\":-3}", true, -7, false, true, -3, false);
    num_bounds("{\"type\":\"number\",\"exclusiveMinimum\":-7,\"exclusiveMaximum\":-3}", true, -7, true, true, -3, true);
    num_bounds("{\"type\":\"number\",\"minimum\":4,\"maximum\":4}", true, 4, false, true, 4, false);
    num_bounds("{\"minimum\":1,\"maximum\":10}", true, 1, false, true, 10, false);   /* no type: a number */
    /* bounds with fractions (until 2026-12-07 refused) */
    num_bounds("{\"type\":\"number\",\"minimum\":0.5,\"maximum\":9.75}", true, 0.5, false, true, 9.75, false);
    num_bounds("{\"type\":\"number\",\"exclusiveMinimum\":-2.25,\"exclusiveMaximum\":3.3}", true, -2.25, true, true, 3.3,
               true);
    num_bounds("{\"type\":\"number\",\"minimum\":0.3,\"maximum\":0.7}", true, 0.3, false, true, 0.7, false);
    num_bounds("{\"type\":\"number\",\"exclusiveMaximum\":-2.25}", false, 0, false, true, -2.25, true);
    num_bounds("{\"type\":\"number\",\"exclusiveMinimum\":0.05}", true, 0.05, true, false, 0, false);
    num_bounds("{\"type\":\"number\",\"minimum\":2.25,\"maximum\":2.25}", true, 2.25, false, true, 2.25, false);
    num_bounds("{\"type\":\"number\",\"minimum\":-0.75,\"exclusiveMaximum\":-0.25}", true, -0.75, false, true, -0.25,
               true);
    num_bounds("{\"type\":\"number\",\"exclusiveMinimum\":7.2501,\"maximum\":7.7}", true, 7.2501, true, true, 7.7, false);
    /* at a bound's integer part the text keeps to 15 significant digits:
     * 100.000000000000001 reads as 100.0, which is not above 100 */
    rlai_grammar *gp = schema("{\"type\":\"number\",\"exclusiveMinimum\":100}");
    ck_assert(acc(gp, "100.000000000001") && acc(gp, "101.00000000000001") && !acc(gp, "100.000000000000001"));
    rlai_grammar_unref(gp);
    /* the type list keeps the other types; a bounded integer beside them */
    rlai_grammar *g = schema("{\"type\":[\"integer\",\"null\"],\"minimum\":1,\"maximum\":3}");
    ck_assert(acc(g, "null") && acc(g, "2") && !acc(g, "4") && !acc(g, "0"));
    rlai_grammar_unref(g);
    /* an unbounded number keeps its exponent */
    g = schema("{\"type\":\"number\"}");
    ck_assert(acc(g, "1e5") && acc(g, "-0.5"));
    rlai_grammar_unref(g);
}
END_TEST

START_TEST(long_enums_keep_every_value)
{
    static char sch[64 * 1024], val[128];
    int n = 300;
    size_t o = (size_t)snprintf(sch, sizeof sch, "{\"enum\":[");
    for (int i = 0; i < n; i++)
        o += (size_t)snprintf(sch + o, sizeof sch - o, "%s\"item_%03d_of_the_list\"", i ? "," : "", i);
    snprintf(sch + o, sizeof sch - o, "]}");
    rlai_grammar *g = schema(sch);
    for (int i = 0; i < n; i++) {
        snprintf(val, sizeof val, "\"item_%03d_of_the_list\"", i);
        ck_assert_msg(acc(g, val), "value %d refused", i);
    }
    ck_assert(!acc(g, "\"item_300_of_the_list\""));
    ck_assert(!acc(g, "\"item_001_of_the\""));
    ck_assert(!acc(g, "\"item_001_of_the_list\"x"));
    rlai_grammar_unref(g);

    /* numbers that are prefixes of each other, duplicates, mixed types */
    g = schema("{\"enum\":[1,12,123,12,-1,1.5,null,true,\"a\",\"ab\",\"a\",[1,2],{\"k\":[]},{\"k\":1}]}");
    const char *yes[] = { "1", "12", "123", "-1", "1.5", "null", "true", "\"a\"", "\"ab\"", "[1,2]",
                          "{\"k\":[]}", "{\"k\":1}" };
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++)
        ck_assert_msg(acc(g, yes[i]), "%s refused", yes[i]);
    const char *no[] = { "1234", "2", "-", "1.", "nul", "false", "\"\"", "\"abc\"", "[1]", "{\"k\":2}", "13" };
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        ck_assert_msg(!acc(g, no[i]), "%s accepted", no[i]);
    rlai_grammar_unref(g);

    /* anyOf / oneOf of consts and enums (a documented list of values):
     * one tree too, however many */
    o = (size_t)snprintf(sch, sizeof sch, "{\"oneOf\":[");
    for (int i = 0; i < n; i++)
        o += (size_t)snprintf(sch + o, sizeof sch - o, "%s{\"const\":\"v%d\",\"description\":\"value %d\"}",
                              i ? "," : "", i, i);
    snprintf(sch + o, sizeof sch - o, ",{\"enum\":[7,8]}]}");
    g = schema(sch);
    for (int i = 0; i < n; i++) {
        snprintf(val, sizeof val, "\"v%d\"", i);
        ck_assert_msg(acc(g, val), "%s refused", val);
    }
    ck_assert(acc(g, "7") && acc(g, "8") && !acc(g, "9") && !acc(g, "\"v300\""));
    rlai_grammar_unref(g);
}
END_TEST

/* More alternatives open at once than the matcher holds (128) is an error
 * said out loud, never a silently narrower grammar: an anyOf of more than
 * 128 schemas is refused at compile time; a state that would pass 128 heads
 * later (nested anyOfs) fails the feed with RLAI_ERR_TOO_LARGE, and the
 * mask does not offer the tokens that lead there. */
START_TEST(too_many_open_alternatives_is_an_error)
{
    static char sch[64 * 1024];
    size_t o = (size_t)snprintf(sch, sizeof sch, "{\"anyOf\":[");
    for (int i = 0; i < 129; i++)
        o += (size_t)snprintf(sch + o, sizeof sch - o, "%s{\"type\":\"string\",\"maxLength\":%d}", i ? "," : "", i + 1);
    snprintf(sch + o, sizeof sch - o, "]}");
    refused(sch, RLAI_ERR_TOO_LARGE, "more than 128 alternatives");
    /* 128 is fine, and a 100-character string is still open to the longer ones */
    o = (size_t)snprintf(sch, sizeof sch, "{\"anyOf\":[");
    for (int i = 0; i < 128; i++)
        o += (size_t)snprintf(sch + o, sizeof sch - o, "%s{\"type\":\"string\",\"maxLength\":%d}", i ? "," : "", i + 1);
    snprintf(sch + o, sizeof sch - o, "]}");
    rlai_grammar *g = schema(sch);
    char text[140];
    memset(text, 'a', sizeof text);
    text[0] = '"';
    text[101] = '"';
    ck_assert(rlai_grammar_accepts(g, text, 102));
    text[129] = '"';
    ck_assert(!rlai_grammar_accepts(g, text, 130));   /* 128 characters: over every maxLength */
    rlai_grammar_unref(g);

    /* 12 x 12 string alternatives inside an array: 144 heads after '["' */
    nested_anyof_144(sch, sizeof sch, true);
    g = schema(sch);
    rlai_grammar_matcher *m = NULL;
    ck_assert_int_eq(rlai_grammar_matcher_new(g, &m), 0);
    ck_assert_int_eq(rlai_grammar_matcher_feed(m, "[\"", 2), RLAI_ERR_TOO_LARGE);
    ck_assert(!acc(g, "[\"a\"]"));
    /* passing by them is fine: "[" holds two heads, "]" steps past them all */
    ck_assert_int_eq(rlai_grammar_matcher_feed(m, "[", 1), 0);
    ck_assert_int_eq(rlai_grammar_matcher_feed(m, "]", 1), 0);
    ck_assert(rlai_grammar_matcher_done(m) || rlai_grammar_matcher_can_end(m));
    ck_assert(acc(g, "[]") && acc(g, "[ ]"));
    rlai_grammar_matcher_free(m);
    rlai_grammar_unref(g);

    /* at the start: the matcher cannot be made */
    nested_anyof_144(sch, sizeof sch, false);
    g = schema(sch);
    m = (rlai_grammar_matcher *)1;
    ck_assert_int_eq(rlai_grammar_matcher_new(g, &m), RLAI_ERR_TOO_LARGE);
    ck_assert_ptr_null(m);
    rlai_grammar_unref(g);
}
END_TEST

/* Schemas whose expansion never ended or grew exponentially, and objects
 * whose later optional properties were cut off:
 * - a '$ref' back to itself before any text hung the matcher (for ever:
 *   the expansion guard was 64 levels of two branches each): refused;
 * - 30 levels of anyOf [$ref next, $ref next] were 2^30 expansions: now
 *   each (rule, return frame) once per byte;
 * - with more than 64 optional properties, "{}" and the later properties
 *   were refused (the guard again): now up to 120 in a row work and more
 *   are refused with a message. */
START_TEST(recursion_and_long_optional_runs)
{
    refused("{\"anyOf\":[{\"$ref\":\"#\"},{\"$ref\":\"#\"}]}", RLAI_ERR_UNSUPPORTED, "refers back to itself");
    refused("{\"anyOf\":[{\"$ref\":\"#\"},{\"type\":\"string\"}]}", RLAI_ERR_UNSUPPORTED, "refers back to itself");
    refused("{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/b\"},\"b\":{\"anyOf\":[{\"type\":\"null\"},{\"$ref\":\"#/$defs/a\"}]}},"
            "\"$ref\":\"#/$defs/a\"}", RLAI_ERR_UNSUPPORTED, "refers back to itself");
    /* recursion after text is fine */
    rlai_grammar *g = schema("{\"$defs\":{\"n\":{\"anyOf\":[{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/n\"}},"
                             "{\"type\":\"string\"}]}},\"$ref\":\"#/$defs/n\"}");
    ck_assert(acc(g, "[[\"a\"],[],\"b\"]") && !acc(g, "[1]"));
    rlai_grammar_unref(g);
    g = schema("{\"type\":\"object\",\"properties\":{\"child\":{\"$ref\":\"#\"}}}");
    ck_assert(acc(g, "{\"child\":{\"child\":{}}}") && !acc(g, "{\"child\":1}"));
    rlai_grammar_unref(g);

    static char sch[64 * 1024];
    size_t o = (size_t)snprintf(sch, sizeof sch, "{\"$defs\":{");
    for (int i = 0; i < 30; i++)
        o += (size_t)snprintf(sch + o, sizeof sch - o, "\"a%d\":{\"anyOf\":[{\"$ref\":\"#/$defs/a%d\"},"
                              "{\"$ref\":\"#/$defs/a%d\"}]},", i, i + 1, i + 1);
    snprintf(sch + o, sizeof sch - o, "\"a30\":{\"type\":\"string\"}},\"$ref\":\"#/$defs/a0\"}");
    g = schema(sch);
    ck_assert(acc(g, "\"deep\"") && !acc(g, "3"));   /* (did not return before the test's timeout) */
    rlai_grammar_unref(g);

    o = (size_t)snprintf(sch, sizeof sch, "{\"type\":\"object\",\"properties\":{");
    for (int i = 0; i < 120; i++)
        o += (size_t)snprintf(sch + o, sizeof sch - o, "%s\"k%d\":{\"type\":\"integer\"}", i ? "," : "", i);
    snprintf(sch + o, sizeof sch - o, "}}");
    g = schema(sch);
    ck_assert(acc(g, "{}"));
    ck_assert(acc(g, "{\"k119\":1}"));
    ck_assert(acc(g, "{\"k0\":1,\"k70\":2,\"k119\":3}"));
    ck_assert(!acc(g, "{\"k70\":2,\"k0\":1}"));     /* schema order */
    rlai_grammar_unref(g);
    o = (size_t)snprintf(sch, sizeof sch, "{\"type\":\"object\",\"required\":[\"k100\"],\"properties\":{");
    for (int i = 0; i < 200; i++)
        o += (size_t)snprintf(sch + o, sizeof sch - o, "%s\"k%d\":{\"type\":\"integer\"}", i ? "," : "", i);
    snprintf(sch + o, sizeof sch - o, "}}");
    g = schema(sch);                                    /* runs of 100 and 99 */
    ck_assert(acc(g, "{\"k100\":1}") && acc(g, "{\"k99\":1,\"k100\":1,\"k199\":1}") && !acc(g, "{}"));
    rlai_grammar_unref(g);
    o = (size_t)snprintf(sch, sizeof sch, "{\"type\":\"object\",\"properties\":{");
    for (int i = 0; i < 121; i++)
        o += (size_t)snprintf(sch + o, sizeof sch - o, "%s\"k%d\":{\"type\":\"integer\"}", i ? "," : "", i);
    snprintf(sch + o, sizeof sch - o, "}}");
    refused(sch, RLAI_ERR_TOO_LARGE, "more than 120 optional properties in a row");
}
END_TEST

/* ------------------------------------------------- masks on the real vocab */

static rlai_gvocab *V;
static rlai_tokenizer *TK;
static rlai_gguf *GG;

static void vocab_setup(void)
{
    char err[256];
    ck_assert_int_eq(rlai_gguf_open_file(MODEL, &GG, err, sizeof(err)), 0);
    ck_assert_int_eq(rlai_tokenizer_load(GG, &TK, err, sizeof(err)), 0);
    ck_assert_int_eq(rlai_gvocab_new(TK, &V), 0);
}

static void vocab_teardown(void)
{
    rlai_gvocab_free(V);
    rlai_tokenizer_free(TK);
    rlai_gguf_close(GG);
}

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

static bool bit(const uint32_t *m, int t) { return (m[t >> 5] >> (t & 31)) & 1; }

/* The mask after feeding text to a matcher of g, checked against the brute
 * force mask; returns its count. *mk: malloc'd, the caller frees it. */
static int mask_after(rlai_grammar *g, const char *text, uint32_t **mk)
{
    int w = rlai_gvocab_mask_words(V);
    uint32_t *slow = malloc(sizeof(uint32_t) * (size_t)w);
    *mk = malloc(sizeof(uint32_t) * (size_t)w);
    rlai_grammar_matcher *m = NULL;
    ck_assert_int_eq(rlai_grammar_matcher_new(g, &m), 0);
    ck_assert_int_eq(rlai_grammar_matcher_feed(m, text, strlen(text)), 0);
    int n = rlai_grammar_matcher_mask(m, V, *mk);
    ck_assert_int_eq(n, rlai_grammar_matcher_mask_slow(m, V, slow));
    ck_assert(!memcmp(*mk, slow, sizeof(uint32_t) * (size_t)w));
    rlai_grammar_matcher_free(m);
    free(slow);
    return n;
}

/* Random walk: at each state compare the masks, then take a random
 * allowed token (biased towards short ones so the text closes). */
static void walk_compare(rlai_grammar *g, int steps)
{
    int w = rlai_gvocab_mask_words(V), nv = rlai_gvocab_n_vocab(V);
    uint32_t *fast = malloc(sizeof(uint32_t) * (size_t)w), *slow = malloc(sizeof(uint32_t) * (size_t)w);
    rlai_grammar_matcher *m = NULL;
    ck_assert_int_eq(rlai_grammar_matcher_new(g, &m), 0);
    int compared = 0;
    for (int s = 0; s < steps; s++) {
        int nf = rlai_grammar_matcher_mask(m, V, fast);
        int ns = rlai_grammar_matcher_mask_slow(m, V, slow);
        ck_assert_int_eq(nf, ns);
        ck_assert_int_gt(nf, 0);
        ck_assert(!memcmp(fast, slow, sizeof(uint32_t) * (size_t)w));
        compared++;
        /* the forced text: every allowed token agrees with it (is a prefix
         * of it or starts with it), and no EOG is allowed before it */
        char fz[64];
        int nfz = rlai_grammar_matcher_forced(m, fz, (int)sizeof(fz));
        ck_assert_int_ge(nfz, 0);
        for (int32_t t = 0; nfz > 0 && t < nv; t++) {
            if (!bit(fast, t))
                continue;
            ck_assert(!rlai_tokenizer_is_eog(TK, t));
            char pc[64];
            int l = rlai_tokenizer_token_to_piece(TK, t, false, pc, sizeof(pc));
            int k = l < nfz ? l : nfz;
            ck_assert_msg(l > 0 && l <= (int)sizeof(pc) && !memcmp(pc, fz, (size_t)k),
                          "token %d (%.*s) allowed against forced %.*s", t, l, pc, nfz, fz);
        }
        /* pick: every allowed token once in a while, mostly single bytes */
        int32_t pick = -1;
        char one[2] = { 0, 0 };
        for (int tries = 0; tries < 200 && pick < 0; tries++) {
            int32_t t = (int32_t)(rnd() % (uint32_t)nv);
            if (!bit(fast, t) || rlai_tokenizer_is_eog(TK, t))
                continue;
            char buf[64];
            int l = rlai_tokenizer_token_to_piece(TK, t, false, buf, sizeof(buf));
            if (l > 3 && rnd() % 4)
                continue;
            pick = t;
        }
        if (pick < 0) {
            for (int32_t t = 0; t < nv && pick < 0; t++)
                if (bit(fast, t) && !rlai_tokenizer_is_eog(TK, t))
                    pick = t;
        }
        if (pick < 0)
            break;   /* only EOG left: complete */
        (void)one;
        ck_assert_int_eq(rlai_grammar_matcher_accept_token(m, V, pick), 0);
        if (rlai_grammar_matcher_done(m))
            break;
    }
    ck_assert_int_gt(compared, 3);
    rlai_grammar_matcher_free(m);
    free(fast);
    free(slow);
}

/* walk_compare over `reps` random walks of the schema's grammar. */
static void walk_schema(const char *sch, int reps, int steps)
{
    rlai_grammar *g = schema(sch);
    for (int r = 0; r < reps; r++)
        walk_compare(g, steps);
    rlai_grammar_unref(g);
}

START_TEST(fast_mask_equals_brute_force)
{
    rlai_grammar *g = NULL;
    ck_assert_int_eq(rlai_grammar_json_object(&g), 0);
    for (int r = 0; r < 4; r++)
        walk_compare(g, 40);
    rlai_grammar_unref(g);
    walk_schema("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":6},"
                "\"kind\":{\"enum\":[\"cat\",\"dog\"]},\"n\":{\"type\":\"number\"},\"ok\":{\"type\":\"boolean\"},"
                "\"xs\":{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":3}},"
                "\"required\":[\"name\",\"kind\",\"xs\"]}", 4, 40);
    /* the fast mask over multipleOf grammars is the brute-force one */
    walk_schema("{\"type\":\"object\",\"properties\":{\"p\":{\"type\":\"number\",\"exclusiveMinimum\":0,\"multipleOf\":0.01},"
                "\"q\":{\"type\":\"integer\",\"minimum\":0,\"multipleOf\":5},\"r\":{\"type\":\"number\",\"minimum\":1,"
                "\"maximum\":5,\"multipleOf\":0.5},\"w\":{\"type\":\"number\",\"multipleOf\":0.125}},"
                "\"required\":[\"p\",\"q\",\"r\",\"w\"]}", 4, 40);
    walk_schema("{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"},\"minProperties\":1,"
                "\"maxProperties\":3}", 4, 30);
    walk_schema("{\"type\":\"object\",\"properties\":{\"t\":{\"type\":\"number\",\"minimum\":0.1,\"maximum\":1.9},"
                "\"m\":{\"type\":\"number\",\"exclusiveMinimum\":-2.25,\"exclusiveMaximum\":0.75}},"
                "\"required\":[\"t\",\"m\"]}", 4, 30);
    /* an enum's prefix tree; a state past 128 heads is not offered */
    static char sch[16 * 1024];
    size_t o = (size_t)snprintf(sch, sizeof sch, "{\"type\":\"array\",\"maxItems\":3,\"items\":{\"enum\":[");
    for (int i = 0; i < 200; i++)
        o += (size_t)snprintf(sch + o, sizeof sch - o, "%s\"%s %d\"", i ? "," : "", i % 2 ? "north" : "no", i);
    snprintf(sch + o, sizeof sch - o, "]}}");
    walk_schema(sch, 4, 30);
    nested_anyof_144(sch, sizeof sch, true);
    g = schema(sch);
    {
        int nv = rlai_gvocab_n_vocab(V);
        uint32_t *fast = NULL;
        mask_after(g, "[", &fast);
        int closing = 0;
        for (int32_t t = 0; t < nv; t++) {
            if (!bit(fast, t))
                continue;
            char pc[64];
            int l = rlai_tokenizer_token_to_piece(TK, t, false, pc, sizeof(pc));
            ck_assert_msg(l > 0 && !memchr(pc, '"', (size_t)l), "token %.*s opens a string past 128 heads", l, pc);
            closing += pc[l - 1] == ']';
        }
        ck_assert_int_gt(closing, 0);
        free(fast);
    }
    rlai_grammar_unref(g);
    const char *call = "{\"properties\":{\"name\":{\"const\":\"get_weather\"},\"arguments\":{\"type\":\"object\"}},"
                       "\"required\":[\"name\",\"arguments\"]}";
    ck_assert_int_eq(rlai_grammar_from_json_schema_flags(call, strlen(call), RLAI_GRAMMAR_OR_TEXT, &g, NULL, 0), 0);
    for (int r = 0; r < 4; r++)
        walk_compare(g, 12);
    rlai_grammar_unref(g);
    /* bounded strings side by side (the plain tokens that fit the largest
     * room are taken at once), with an enum beside them at times (then
     * the whole vocabulary is walked) */
    o = (size_t)snprintf(sch, sizeof sch, "{\"type\":\"array\",\"minItems\":2,\"maxItems\":4,\"items\":{\"anyOf\":[");
    for (int i = 0; i < 20; i++)
        o += (size_t)snprintf(sch + o, sizeof sch - o, "{\"type\":\"string\",\"maxLength\":%d},", i + 1);
    snprintf(sch + o, sizeof sch - o,
             "{\"type\":\"string\",\"minLength\":3,\"maxLength\":5},{\"enum\":[\"abcdefghijklmnopqrstuvwxyz\"]}]}}");
    walk_schema(sch, 2, 30);
    /* formats */
    walk_schema("{\"type\":\"array\",\"minItems\":2,\"maxItems\":3,\"items\":{\"anyOf\":["
                "{\"type\":\"string\",\"format\":\"date-time\"},{\"type\":\"string\",\"format\":\"uuid\"}]}}", 1, 30);
    /* addresses, URIs, host names: long repetitions whose tokens the
     * mask takes at once (rep_cache); a small maxLength shrinks them */
    walk_schema("{\"type\":\"array\",\"minItems\":3,\"maxItems\":4,\"items\":{\"anyOf\":["
                "{\"type\":\"string\",\"format\":\"email\"},{\"type\":\"string\",\"format\":\"uri\"},"
                "{\"type\":\"string\",\"format\":\"hostname\"}]}}", 3, 60);
    walk_schema("{\"type\":\"array\",\"minItems\":2,\"maxItems\":3,\"items\":{\"anyOf\":["
                "{\"type\":\"string\",\"format\":\"uri\",\"maxLength\":60},{\"type\":\"string\",\"format\":\"email\",\"maxLength\":30}]}}", 3, 60);
    /* uniqueItems over an enum, and a duration */
    walk_schema("{\"type\":\"object\",\"properties\":{\"tags\":{\"type\":\"array\",\"uniqueItems\":true,"
                "\"items\":{\"enum\":[\"red\",\"green\",\"blue\",\"gold\",\"grey\"]}},"
                "\"wait\":{\"type\":\"string\",\"format\":\"duration\"}},\"required\":[\"tags\",\"wait\"]}", 3, 40);
    /* distinct strings (set[str]) beside a list of them */
    walk_schema("{\"type\":\"array\",\"uniqueItems\":true,\"minItems\":4,\"maxItems\":8,"
                "\"items\":{\"type\":\"string\",\"maxLength\":2}}", 3, 40);
    walk_schema("{\"type\":\"object\",\"properties\":{\"tags\":{\"type\":\"array\",\"uniqueItems\":true,"
                "\"items\":{\"type\":\"string\"},\"maxItems\":6},\"more\":{\"type\":\"array\",\"minItems\":2,"
                "\"uniqueItems\":true,\"items\":{\"type\":\"string\",\"minLength\":1}}},\"required\":[\"tags\",\"more\"]}",
                3, 40);
    /* patterns: a phone number, and an unanchored word with escapes */
    walk_schema("{\"type\":\"array\",\"minItems\":2,\"maxItems\":3,\"items\":{\"anyOf\":["
                "{\"type\":\"string\",\"pattern\":\"^\\\\+?[0-9 ()-]{7,12}$\"},"
                "{\"type\":\"string\",\"pattern\":\"(cat|\\\"q\\\")s?\"}]}}", 1, 30);
    /* a tuple, then booleans */
    walk_schema("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\",\"minimum\":0,\"maximum\":9},"
                "{\"enum\":[\"ab\",\"cd\"]}],\"items\":{\"type\":\"boolean\"},\"minItems\":3,\"maxItems\":5}", 1, 30);
    /* bounded integers and numbers */
    walk_schema("{\"type\":\"array\",\"minItems\":3,\"maxItems\":5,\"items\":{\"anyOf\":["
                "{\"type\":\"integer\",\"minimum\":-40,\"maximum\":1250},"
                "{\"type\":\"number\",\"exclusiveMinimum\":0,\"maximum\":1}]}}", 1, 30);
    walk_schema("{\"type\":\"array\",\"minItems\":3,\"items\":{\"type\":\"string\",\"minLength\":2,\"maxLength\":7}}", 2, 30);
}
END_TEST

/* In strings of maxLength 3 and 9, after "ab: the plain tokens of up to 7
 * bytes (the larger room) are offered, none longer, and the 7-byte ones
 * are there. */
START_TEST(bounded_strings_offer_what_fits)
{
    rlai_grammar *g = schema("{\"anyOf\":[{\"type\":\"string\",\"maxLength\":3},{\"type\":\"string\",\"maxLength\":9}]}");
    int nv = rlai_gvocab_n_vocab(V);
    uint32_t *mk = NULL;
    mask_after(g, "\"ab", &mk);
    int at7 = 0;
    for (int32_t t = 0; t < nv; t++) {
        char pc[64];
        int l = rlai_tokenizer_token_to_piece(TK, t, false, pc, sizeof(pc));
        bool plain = l > 0 && l <= (int)sizeof(pc);
        for (int i = 0; plain && i < l; i++)
            plain = (unsigned char)pc[i] >= 0x20 && (unsigned char)pc[i] < 0x80 && pc[i] != '"' && pc[i] != '\\';
        if (!plain || rlai_tokenizer_is_eog(TK, t))
            continue;
        ck_assert_msg(bit(mk, t) == (l <= 7), "plain token %.*s (%d bytes): offered %d", l, pc, l, bit(mk, t));
        at7 += l == 7;
    }
    ck_assert_int_gt(at7, 0);
    rlai_grammar_unref(g);
    free(mk);
}
END_TEST

/* The token whose piece is exactly text, or -1. */
static int32_t token_of(const char *text)
{
    int nv = rlai_gvocab_n_vocab(V);
    for (int32_t t = 0; t < nv; t++) {
        char pc[64];
        int l = rlai_tokenizer_token_to_piece(TK, t, false, pc, sizeof(pc));
        if (l == (int)strlen(text) && !memcmp(pc, text, (size_t)l))
            return t;
    }
    return -1;
}

/* set[str]: the mask (equal to brute force, mask_after) takes a closing
 * token only when the item's value is new: after ["a","ab the quote
 * tokens close "ab" (new); after ["ab","a","a they would close "a" again,
 * and "b" plus a quote would close "ab" again. Under a maxLength the
 * character that would fill an item as an earlier one is refused too. */
START_TEST(unique_strings_mask)
{
    rlai_grammar *g = schema("{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"uniqueItems\":true}");
    static const char *const quote[] = { "\"", "\",", "\"]" }, *const b_quote[] = { "b\"", "b\",", "b\"]" };
    int found = 0;
    uint32_t *mk = NULL;
    ck_assert_int_gt(mask_after(g, "[\"a\",\"ab", &mk), 0);
    for (int i = 0; i < 3; i++) {
        int32_t t = token_of(quote[i]);
        found += t >= 0;
        ck_assert_msg(t < 0 || bit(mk, t), "%s refused after [\"a\",\"ab", quote[i]);
    }
    free(mk);
    ck_assert_int_gt(mask_after(g, "[\"ab\",\"a\",\"a", &mk), 0);
    for (int i = 0; i < 3; i++) {
        int32_t t = token_of(quote[i]), tb = token_of(b_quote[i]);
        found += tb >= 0;
        ck_assert_msg(t < 0 || !bit(mk, t), "%s allowed after [\"ab\",\"a\",\"a", quote[i]);
        ck_assert_msg(tb < 0 || !bit(mk, tb), "%s allowed after [\"ab\",\"a\",\"a", b_quote[i]);
    }
    int32_t c = token_of("c");
    ck_assert(c >= 0 && bit(mk, c));
    ck_assert_int_ge(found, 3);
    free(mk);
    rlai_grammar_unref(g);
    /* with maxLength 2, after ["ab","a the "b" that would fill the item
     * as "ab" again is refused, alone or with the quote; "c" is not */
    g = schema("{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":2},\"uniqueItems\":true}");
    ck_assert_int_gt(mask_after(g, "[\"ab\",\"a", &mk), 0);
    int32_t b = token_of("b"), cq = token_of("c\"");
    ck_assert(b >= 0 && !bit(mk, b) && bit(mk, c));
    for (int i = 0; i < 3; i++) {
        int32_t tb = token_of(b_quote[i]);
        ck_assert(tb < 0 || !bit(mk, tb));
    }
    ck_assert(cq < 0 || bit(mk, cq));
    free(mk);
    rlai_grammar_unref(g);
}
END_TEST

START_TEST(mask_rules_at_the_edges)
{
    rlai_grammar *g = schema("{\"enum\":[\"ab\"]}");
    int w = rlai_gvocab_mask_words(V), nv = rlai_gvocab_n_vocab(V);
    uint32_t *mk = malloc(sizeof(uint32_t) * (size_t)w);
    rlai_grammar_matcher *m = NULL;
    ck_assert_int_eq(rlai_grammar_matcher_new(g, &m), 0);
    /* at the start no EOG and no control token is allowed */
    ck_assert_int_gt(rlai_grammar_matcher_mask(m, V, mk), 0);
    for (int t = 0; t < nv; t++)
        if (bit(mk, t)) {
            ck_assert(!rlai_tokenizer_is_eog(TK, t));
            char buf[64];
            int l = rlai_tokenizer_token_to_piece(TK, t, false, buf, sizeof(buf));
            ck_assert_int_gt(l, 0);
            ck_assert(!strncmp(buf, "\"ab\"", (size_t)l));
        }
    int32_t eog = rlai_tokenizer_eos(TK);
    ck_assert_int_eq(rlai_grammar_matcher_accept_token(m, V, eog), RLAI_ERR_INVALID_ARG);
    ck_assert_int_eq(rlai_grammar_matcher_feed(m, "\"ab\"", 4), 0);
    /* complete: only end-of-generation tokens remain */
    int n = rlai_grammar_matcher_mask(m, V, mk);
    ck_assert_int_gt(n, 0);
    for (int t = 0; t < nv; t++)
        ck_assert(bit(mk, t) == rlai_tokenizer_is_eog(TK, t));
    ck_assert_int_eq(rlai_grammar_matcher_accept_token(m, V, eog), 0);
    rlai_grammar_matcher_free(m);
    rlai_grammar_unref(g);
    free(mk);
}
END_TEST

/* ------------------------------------------------------ real model */

typedef struct collect {
    char text[8192];
    size_t len;
    rlai_token toks[1024];
    int n;
} collect;

static int on_tok(void *user, rlai_token tok, const char *text, size_t len)
{
    collect *c = user;
    if (c->len + len < sizeof(c->text)) {
        memcpy(c->text + c->len, text, len);
        c->len += len;
        c->text[c->len] = 0;
    }
    if (tok >= 0 && c->n < 1024)
        c->toks[c->n++] = tok;
    return 0;
}

/* Greedy (temp 0) or seeded sampling of `user`'s JSON answer under g. */
static void run_chat(rlai_engine *e, rlai_grammar *g, const char *user, float temp, rlai_spec_mode spec,
                     collect *c, rlai_gen_metrics *mt)
{
    rlai_chat_message msgs[] = {
        { "system", "You reply with JSON only." },
        { "user", user },
    };
    rlai_token *toks = NULL;
    int n = 0;
    ck_assert_int_eq(rlai_engine_tokenize_chat(e, msgs, 2, true, &toks, &n), 0);
    rlai_gen_params gp;
    rlai_gen_params_init(&gp);
    gp.sampling.temperature = temp;
    gp.sampling.seed = 99;
    gp.max_tokens = 200;
    gp.grammar = g;
    gp.spec = spec;
    memset(c, 0, sizeof(*c));
    ck_assert_int_eq(rlai_engine_generate_tokens(e, toks, n, &gp, on_tok, c, mt), 0);
    free(toks);
}

/* The default model on 2 threads, the engine's defaults otherwise. */
static rlai_engine *open_model(void)
{
    rlai_engine_params ep;
    rlai_engine_params_init(&ep);
    ep.n_threads = 2;
    rlai_engine *e = NULL;
    char err[256];
    ck_assert_msg(rlai_engine_open(MODEL, &ep, &e, err, sizeof(err)) == 0, "%s", err);
    return e;
}

static void run_model(rlai_engine *e, rlai_grammar *g, rlai_spec_mode spec, collect *c, rlai_gen_metrics *mt)
{
    run_chat(e, g, "Describe a cat named Tom who is 3 years old, with two hobbies.", 0, spec, c, mt);
}

START_TEST(model_greedy_under_schema_is_valid)
{
    const char *sch = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":20},"
                      "\"age\":{\"type\":\"integer\"},\"hobbies\":{\"type\":\"array\",\"items\":{\"type\":\"string\","
                      "\"maxLength\":24},\"minItems\":2,\"maxItems\":2}},\"required\":[\"name\",\"age\",\"hobbies\"],"
                      "\"additionalProperties\":false}";
    rlai_grammar *g = schema(sch);
    rlai_engine *e = open_model();
    char err[256];
    collect *a = malloc(sizeof(collect)), *b = malloc(sizeof(collect));
    rlai_gen_metrics ma, mb;
    run_model(e, g, RLAI_SPEC_OFF, a, &ma);
    ck_assert_msg(ma.stop == RLAI_STOP_EOG, "stop %d text %s", ma.stop, a->text);
    ck_assert_msg(rlai_grammar_accepts(g, a->text, a->len), "not valid: %s", a->text);
    ck_assert_ptr_nonnull(strstr(a->text, "\"hobbies\""));
    /* with speculation: the same tokens (each verification row is masked
     * as its plain step is); model_schema_drafts_copying checks drafting */
    run_model(e, g, RLAI_SPEC_NGRAM, b, &mb);
    ck_assert_int_le(mb.accepted_tokens, mb.drafted_tokens);
    ck_assert_int_eq(a->n, b->n);
    ck_assert(!memcmp(a->toks, b->toks, sizeof(rlai_token) * (size_t)a->n));
    /* every emitted token was allowed by the mask of its step */
    rlai_gvocab *v = NULL;
    rlai_tokenizer *tk = NULL;
    rlai_gguf *gg = NULL;
    ck_assert_int_eq(rlai_gguf_open_file(MODEL, &gg, err, sizeof(err)), 0);
    ck_assert_int_eq(rlai_tokenizer_load(gg, &tk, err, sizeof(err)), 0);
    ck_assert_int_eq(rlai_gvocab_new(tk, &v), 0);
    uint32_t *mk = malloc(sizeof(uint32_t) * (size_t)rlai_gvocab_mask_words(v));
    rlai_grammar_matcher *m = NULL;
    ck_assert_int_eq(rlai_grammar_matcher_new(g, &m), 0);
    for (int i = 0; i < a->n; i++) {
        ck_assert_int_gt(rlai_grammar_matcher_mask(m, v, mk), 0);
        ck_assert(bit(mk, a->toks[i]));
        ck_assert_int_eq(rlai_grammar_matcher_accept_token(m, v, a->toks[i]), 0);
    }
    ck_assert(rlai_grammar_matcher_done(m));
    rlai_grammar_matcher_free(m);
    free(mk);
    rlai_gvocab_free(v);
    rlai_tokenizer_free(tk);
    rlai_gguf_close(gg);
    /* json_object under the scheduler, two requests at once */
    rlai_grammar *jo = NULL;
    ck_assert_int_eq(rlai_grammar_json_object(&jo), 0);
    run_model(e, jo, RLAI_SPEC_AUTO, a, &ma);
    ck_assert_msg(rlai_grammar_accepts(jo, a->text, a->len) || ma.stop == RLAI_STOP_MAX_TOKENS,
                  "stop %d: %s", ma.stop, a->text);
    ck_assert(a->text[0] == '{');
    rlai_grammar_unref(jo);
    rlai_grammar_unref(g);   /* the engine holds no reference after the requests */
    rlai_engine_close(e);
    free(a);
    free(b);
}
END_TEST

/* The forced text of a state: what every continuation starts with. */
START_TEST(forced_text_of_keys_and_literals)
{
    rlai_grammar *g = schema("{\"type\":\"object\",\"properties\":{\"character_name\":{\"type\":\"string\"},"
                             "\"level\":{\"type\":\"integer\"},\"class\":{\"enum\":[\"paladin of dawn\"]}},"
                             "\"required\":[\"character_name\",\"level\",\"class\"],\"additionalProperties\":false}");
    rlai_grammar_matcher *m = NULL;
    ck_assert_int_eq(rlai_grammar_matcher_new(g, &m), 0);
    static const struct { const char *feed, *forced; } steps[] = {
        { "", "{" },                           /* the object's brace */
        { "{", "" },                           /* whitespace or a quote */
        { "\"", "character_name\"" },          /* the first required key, to its quote */
        { "character_name\": \"Ab", "" },      /* inside free text */
        { "c\",", "" },
        { " \"", "level\"" },
        { "level\":", "" },
        { "3, \"class\": \"", "paladin of dawn\"" },   /* the enum's only value */
        { "paladin of dawn\"", "" },            /* "}" or whitespace */
        { "}", "" },                           /* complete */
    };
    char buf[64];
    for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
        const char *f = steps[i].feed;
        ck_assert_int_eq(rlai_grammar_matcher_feed(m, f, strlen(f)), 0);
        int n = rlai_grammar_matcher_forced(m, buf, (int)sizeof(buf));
        ck_assert_msg(n == (int)strlen(steps[i].forced) && !memcmp(buf, steps[i].forced, (size_t)n),
                      "after \"%s\": forced %.*s (%d), want %s", f, n > 0 ? n : 0, buf, n, steps[i].forced);
    }
    ck_assert(rlai_grammar_matcher_done(m));
    rlai_grammar_matcher_free(m);
    /* cap bounds it; the state does not move */
    ck_assert_int_eq(rlai_grammar_matcher_new(g, &m), 0);
    ck_assert_int_eq(rlai_grammar_matcher_feed(m, "{\"", 2), 0);
    ck_assert_int_eq(rlai_grammar_matcher_forced(m, buf, 4), 4);
    ck_assert(!memcmp(buf, "char", 4));
    ck_assert_int_eq(rlai_grammar_matcher_forced(m, buf, 0), 0);
    ck_assert_int_eq(rlai_grammar_matcher_forced(m, buf, (int)sizeof(buf)), 15);
    ck_assert_int_eq(rlai_grammar_matcher_feed(m, "x", 1), RLAI_ERR_INVALID_ARG);   /* not the key */
    ck_assert_int_eq(rlai_grammar_matcher_forced(m, buf, (int)sizeof(buf)), 15);
    ck_assert_int_eq(rlai_grammar_matcher_feed(m, "character_name\"", 15), 0);
    ck_assert_int_eq(rlai_grammar_matcher_forced(m, NULL, 4), RLAI_ERR_INVALID_ARG);
    ck_assert_int_eq(rlai_grammar_matcher_forced(NULL, buf, 4), RLAI_ERR_INVALID_ARG);
    ck_assert_int_eq(rlai_grammar_matcher_forced(m, buf, -1), RLAI_ERR_INVALID_ARG);
    rlai_grammar_matcher_free(m);
    rlai_grammar_unref(g);
}
END_TEST

/* `user`'s answer under g without drafts, then with prompt-lookup drafts:
 * the first is complete and valid, the second the same tokens. *mb: the
 * drafted run's metrics. */
static void same_with_drafts(rlai_engine *e, rlai_grammar *g, const char *user, float temp, rlai_gen_metrics *mb)
{
    collect *a = malloc(sizeof(collect)), *b = malloc(sizeof(collect));
    ck_assert(a && b);
    rlai_gen_metrics ma;
    run_chat(e, g, user, temp, RLAI_SPEC_OFF, a, &ma);
    ck_assert_int_eq(ma.drafted_tokens, 0);
    ck_assert_msg(ma.stop == RLAI_STOP_EOG, "temp %g: stop %d, text %s", temp, ma.stop, a->text);
    ck_assert_msg(rlai_grammar_accepts(g, a->text, a->len), "not valid: %s", a->text);
    run_chat(e, g, user, temp, RLAI_SPEC_NGRAM, b, mb);
    ck_assert_int_eq(mb->stop, ma.stop);
    ck_assert_msg(a->n == b->n && !memcmp(a->toks, b->toks, sizeof(rlai_token) * (size_t)a->n),
                  "temp %g: output differs with drafts:\n%s\n%s", temp, a->text, b->text);
    ck_assert_int_le(mb->accepted_tokens, mb->drafted_tokens);
    fprintf(stderr, "schema, temp %.1f: %d tokens, %d drafted, %d accepted: %s\n", temp, b->n, mb->drafted_tokens,
            mb->accepted_tokens, b->text);
    free(a);
    free(b);
}

/* Keys a schema requires are drafted from the grammar itself: a forced
 * key is proposed as one draft (tokenized, its last token left out) and
 * the output stays the plain decoding's. The keys appear nowhere in the
 * prompt, so prompt lookup alone accepts far fewer (13 here, against 39
 * with the keys); same_with_drafts() runs both and compares. */
START_TEST(model_schema_keys_are_drafted)
{
    const char *sch = "{\"type\":\"object\",\"properties\":{\"hero_full_name\":{\"type\":\"string\",\"maxLength\":40},"
                      "\"favourite_weapon_of_the_hero\":{\"type\":\"string\",\"maxLength\":40},"
                      "\"number_of_dragons_defeated\":{\"type\":\"integer\"}},\"required\":[\"hero_full_name\","
                      "\"favourite_weapon_of_the_hero\",\"number_of_dragons_defeated\"],\"additionalProperties\":false}";
    rlai_grammar *g = schema(sch);
    rlai_engine *e = open_model();
    rlai_gen_metrics mb;
    same_with_drafts(e, g, "Invent a hero for my game.", 0, &mb);
    ck_assert_int_ge(mb.accepted_tokens, 25);
    rlai_grammar_unref(g);
    rlai_engine_close(e);
}
END_TEST

/* Structured output that copies its context (extraction) is where prompt
 * lookup pays: under a schema the drafts are verified row by row against
 * the grammar's mask of that row's state, and the output is the plain
 * decoding's, greedy and sampled, with most of it drafted. */
START_TEST(model_schema_drafts_copying)
{
    const char *sch = "{\"type\":\"object\",\"properties\":{\"title\":{\"type\":\"string\"},"
                      "\"first_sentence\":{\"type\":\"string\"}},\"required\":[\"title\",\"first_sentence\"],"
                      "\"additionalProperties\":false}";
    const char *user = "Copy the title and the first sentence of this notice into JSON.\n\n"
                       "Title: Harbour closing hours\n"
                       "The harbour gates of Port Elsmere close at nine in the evening from the first of "
                       "October until the end of March. Boats that arrive later must wait at the outer buoy.";
    rlai_grammar *g = schema(sch);
    rlai_engine *e = open_model();
    rlai_gen_metrics mb;
    long drafted = 0, accepted = 0;
    const float temps[2] = { 0.0f, 0.8f };
    for (int k = 0; k < 2; k++) {
        same_with_drafts(e, g, user, temps[k], &mb);
        drafted += mb.drafted_tokens;
        accepted += mb.accepted_tokens;
    }
    /* the greedy answer copies the notice: most of it came from drafts */
    ck_assert_int_gt(drafted, 0);
    ck_assert_int_gt(accepted, 15);
    rlai_grammar_unref(g);
    rlai_engine_close(e);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("grammar");
    TCase *tc = tcase_create("matcher");
    tcase_add_test(tc, json_object_accepts_objects_only);
    tcase_add_test(tc, schema_objects_and_types);
    tcase_add_test(tc, schema_refusals);
    tcase_add_test(tc, schema_tuples_and_all_of);
    tcase_add_test(tc, string_formats);
    tcase_add_test(tc, multiple_of);
    tcase_add_test(tc, discriminated_union);
    tcase_add_test(tc, property_counts);
    tcase_add_test(tc, unique_items_of_enums);
    tcase_add_test(tc, unique_items_of_strings);
    tcase_add_test(tc, string_text_is_exact);
    tcase_add_test(tc, string_patterns);
    tcase_add_test(tc, numeric_bounds_integers);
    tcase_add_test(tc, numeric_bounds_numbers);
    tcase_add_test(tc, long_enums_keep_every_value);
    tcase_add_test(tc, too_many_open_alternatives_is_an_error);
    tcase_add_test(tc, recursion_and_long_optional_runs);
    tcase_add_test(tc, forced_text_of_keys_and_literals);
    suite_add_tcase(s, tc);
    TCase *tv = tcase_create("vocab");
    tcase_add_checked_fixture(tv, vocab_setup, vocab_teardown);
    tcase_set_timeout(tv, 600);
    tcase_add_test(tv, fast_mask_equals_brute_force);
    tcase_add_test(tv, bounded_strings_offer_what_fits);
    tcase_add_test(tv, mask_rules_at_the_edges);
    tcase_add_test(tv, unique_strings_mask);
    suite_add_tcase(s, tv);
    TCase *tm = tcase_create("model");
    tcase_set_timeout(tm, 600);
    tcase_add_test(tm, model_greedy_under_schema_is_valid);
    tcase_add_test(tm, model_schema_drafts_copying);
    tcase_add_test(tm, model_schema_keys_are_drafted);
    suite_add_tcase(s, tm);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
