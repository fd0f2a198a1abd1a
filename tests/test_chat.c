/* test_chat.c - unit tests for engine/chat.c */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"

/* SmolLM2's template as stored in the GGUF: the "\n" inside the quoted
 * strings are real newline characters. */
static const char SMOL_TMPL_REAL[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
    "Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}";

/* The same template with backslash-n escapes (as in tokenizer_config.json). */
static const char SMOL_TMPL_ESC[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by "
    "Hugging Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}";

static const char SMOL_SYS[] = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

static const char LLAMA3_TMPL[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}";

static const char GEMMA_TMPL[] =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'assistant') %}"
    "{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}";

static char *fmt(rlai_chat_style st, const char *sys, const rlai_chat_message *m, int n,
                 bool gen)
{
    char *out = NULL;
    ck_assert_int_eq(rlai_chat_format(st, sys, m, n, gen, &out), RLAI_OK);
    ck_assert_ptr_nonnull(out);
    return out;
}

#define CHECK_FMT(st, sys, m, n, gen, expect)                                                \
    do {                                                                                     \
        char *o_ = fmt(st, sys, m, n, gen);                                                  \
        ck_assert_str_eq(o_, expect);                                                        \
        free(o_);                                                                            \
    } while (0)

START_TEST(test_detect)
{
    ck_assert_int_eq(rlai_chat_detect(NULL, 0), RLAI_CHAT_CHATML);
    ck_assert_int_eq(rlai_chat_detect("", 0), RLAI_CHAT_CHATML);
    ck_assert_int_eq(rlai_chat_detect("{{ foo }}", 9), RLAI_CHAT_CHATML);
    ck_assert_int_eq(rlai_chat_detect(SMOL_TMPL_REAL, strlen(SMOL_TMPL_REAL)), RLAI_CHAT_CHATML);
    ck_assert_int_eq(rlai_chat_detect(LLAMA3_TMPL, strlen(LLAMA3_TMPL)), RLAI_CHAT_LLAMA3);
    ck_assert_int_eq(rlai_chat_detect(GEMMA_TMPL, strlen(GEMMA_TMPL)), RLAI_CHAT_GEMMA);
    /* len is honoured: the marker past len is not seen */
    const char t[] = "xx<start_of_turn>";
    ck_assert_int_eq(rlai_chat_detect(t, 5), RLAI_CHAT_CHATML);
    ck_assert_int_eq(rlai_chat_detect(t, sizeof(t) - 1), RLAI_CHAT_GEMMA);
    ck_assert_str_eq(rlai_chat_style_name(RLAI_CHAT_CHATML), "chatml");
    ck_assert_str_eq(rlai_chat_style_name(RLAI_CHAT_LLAMA3), "llama3");
    ck_assert_str_eq(rlai_chat_style_name(RLAI_CHAT_GEMMA), "gemma");
    ck_assert_str_eq(rlai_chat_style_name((rlai_chat_style)42), "unknown");
}
END_TEST

START_TEST(test_default_system)
{
    char *s = rlai_chat_default_system(SMOL_TMPL_REAL, strlen(SMOL_TMPL_REAL));
    ck_assert_ptr_nonnull(s);
    ck_assert_str_eq(s, SMOL_SYS);
    free(s);
    s = rlai_chat_default_system(SMOL_TMPL_ESC, strlen(SMOL_TMPL_ESC));
    ck_assert_ptr_nonnull(s);
    ck_assert_str_eq(s, SMOL_SYS);
    free(s);

    /* none in these */
    ck_assert_ptr_null(rlai_chat_default_system(NULL, 0));
    ck_assert_ptr_null(rlai_chat_default_system(LLAMA3_TMPL, strlen(LLAMA3_TMPL)));
    ck_assert_ptr_null(rlai_chat_default_system(GEMMA_TMPL, strlen(GEMMA_TMPL)));
    /* a system header followed by the message content is not a default */
    const char qwen_tools[] =
        "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}";
    ck_assert_ptr_null(rlai_chat_default_system(qwen_tools, strlen(qwen_tools)));
    /* ... but a later literal default is found; double quotes and escapes */
    const char qwen[] =
        "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
        "{%- else %}{{- \"<|im_start|>system\\nYou are \\\"Qwen\\\", it's\\tfine.<|im_end|>\\n\" }}";
    s = rlai_chat_default_system(qwen, strlen(qwen));
    ck_assert_ptr_nonnull(s);
    ck_assert_str_eq(s, "You are \"Qwen\", it's\tfine.");
    free(s);
    /* truncated template: no <|im_end|> */
    const char trunc[] = "{{ '<|im_start|>system\nYou are";
    ck_assert_ptr_null(rlai_chat_default_system(trunc, strlen(trunc)));
    /* length limits the search */
    ck_assert_ptr_null(rlai_chat_default_system(SMOL_TMPL_REAL, 60));
}
END_TEST

START_TEST(test_chatml)
{
    const rlai_chat_message conv[] = {
        {"user", "Hi"},
        {"assistant", "Hello!"},
        {"user", "What is 2+2?"},
    };
    CHECK_FMT(RLAI_CHAT_CHATML, NULL, conv, 3, true,
              "<|im_start|>user\nHi<|im_end|>\n"
              "<|im_start|>assistant\nHello!<|im_end|>\n"
              "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
              "<|im_start|>assistant\n");
    CHECK_FMT(RLAI_CHAT_CHATML, NULL, conv, 1, false, "<|im_start|>user\nHi<|im_end|>\n");

    /* SmolLM2: default system injected before a conversation without one */
    char *def = rlai_chat_default_system(SMOL_TMPL_REAL, strlen(SMOL_TMPL_REAL));
    ck_assert_ptr_nonnull(def);
    CHECK_FMT(RLAI_CHAT_CHATML, def, conv, 1, true,
              "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
              "Hugging Face<|im_end|>\n"
              "<|im_start|>user\nHi<|im_end|>\n"
              "<|im_start|>assistant\n");
    /* ... and not when the conversation has its own system message */
    const rlai_chat_message sys_conv[] = {
        {"system", "Be brief."},
        {"user", "Hi"},
    };
    CHECK_FMT(RLAI_CHAT_CHATML, def, sys_conv, 2, true,
              "<|im_start|>system\nBe brief.<|im_end|>\n"
              "<|im_start|>user\nHi<|im_end|>\n"
              "<|im_start|>assistant\n");
    /* empty conversation: only the generation prompt (template loop is empty) */
    CHECK_FMT(RLAI_CHAT_CHATML, def, NULL, 0, true, "<|im_start|>assistant\n");
    CHECK_FMT(RLAI_CHAT_CHATML, def, NULL, 0, false, "");
    free(def);

    /* empty / NULL content, whitespace kept verbatim, tool role */
    const rlai_chat_message odd[] = {
        {"user", ""},
        {"assistant", NULL},
        {"tool", "  {\"x\": 1}\n"},
    };
    CHECK_FMT(RLAI_CHAT_CHATML, NULL, odd, 3, false,
              "<|im_start|>user\n<|im_end|>\n"
              "<|im_start|>assistant\n<|im_end|>\n"
              "<|im_start|>tool\n  {\"x\": 1}\n<|im_end|>\n");
}
END_TEST

START_TEST(test_llama3)
{
    const rlai_chat_message conv[] = {
        {"system", "You are terse."},
        {"user", "  Hi there \n"},
        {"assistant", "Hello."},
        {"user", ""},
    };
    CHECK_FMT(RLAI_CHAT_LLAMA3, NULL, conv, 4, true,
              "<|begin_of_text|>"
              "<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\n<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\n");
    CHECK_FMT(RLAI_CHAT_LLAMA3, "Default.", conv + 1, 1, false,
              "<|begin_of_text|>"
              "<|start_header_id|>system<|end_header_id|>\n\nDefault.<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>");
    CHECK_FMT(RLAI_CHAT_LLAMA3, "Default.", conv, 1, false,
              "<|begin_of_text|>"
              "<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>");
}
END_TEST

START_TEST(test_gemma)
{
    const rlai_chat_message conv[] = {
        {"user", "Hi"},
        {"assistant", "Hello! "},
        {"user", "Bye"},
    };
    CHECK_FMT(RLAI_CHAT_GEMMA, NULL, conv, 3, true,
              "<start_of_turn>user\nHi<end_of_turn>\n"
              "<start_of_turn>model\nHello!<end_of_turn>\n"
              "<start_of_turn>user\nBye<end_of_turn>\n"
              "<start_of_turn>model\n");
    /* system merged into the first user turn */
    const rlai_chat_message sys_conv[] = {
        {"system", "Be kind."},
        {"user", "Hi"},
        {"assistant", "Hey"},
    };
    CHECK_FMT(RLAI_CHAT_GEMMA, "ignored", sys_conv, 3, false,
              "<start_of_turn>user\nBe kind.\n\nHi<end_of_turn>\n"
              "<start_of_turn>model\nHey<end_of_turn>\n");
    /* default system behaves the same way */
    CHECK_FMT(RLAI_CHAT_GEMMA, "Default.", conv, 1, true,
              "<start_of_turn>user\nDefault.\n\nHi<end_of_turn>\n"
              "<start_of_turn>model\n");
    /* system alone becomes a user turn; empty content */
    CHECK_FMT(RLAI_CHAT_GEMMA, NULL, sys_conv, 1, true,
              "<start_of_turn>user\nBe kind.<end_of_turn>\n"
              "<start_of_turn>model\n");
    const rlai_chat_message empty[] = {{"user", ""}};
    CHECK_FMT(RLAI_CHAT_GEMMA, NULL, empty, 1, false, "<start_of_turn>user\n<end_of_turn>\n");
}
END_TEST

START_TEST(test_invalid)
{
    char *out = (char *)"sentinel";
    const rlai_chat_message bad_role[] = {{"user", "a"}, {"robot", "b"}};
    ck_assert_int_eq(rlai_chat_format(RLAI_CHAT_CHATML, NULL, bad_role, 2, true, &out),
                     RLAI_ERR_INVALID_ARG);
    ck_assert_ptr_null(out);
    const rlai_chat_message null_role[] = {{NULL, "a"}};
    ck_assert_int_eq(rlai_chat_format(RLAI_CHAT_CHATML, NULL, null_role, 1, true, &out),
                     RLAI_ERR_INVALID_ARG);
    const rlai_chat_message upper[] = {{"User", "a"}};
    ck_assert_int_eq(rlai_chat_format(RLAI_CHAT_CHATML, NULL, upper, 1, true, &out),
                     RLAI_ERR_INVALID_ARG);
    /* "tool" only for ChatML */
    const rlai_chat_message tool[] = {{"tool", "x"}};
    ck_assert_int_eq(rlai_chat_format(RLAI_CHAT_LLAMA3, NULL, tool, 1, true, &out),
                     RLAI_ERR_INVALID_ARG);
    ck_assert_int_eq(rlai_chat_format(RLAI_CHAT_GEMMA, NULL, tool, 1, true, &out),
                     RLAI_ERR_INVALID_ARG);
    ck_assert_int_eq(rlai_chat_format(RLAI_CHAT_CHATML, NULL, NULL, 2, true, &out),
                     RLAI_ERR_INVALID_ARG);
    ck_assert_int_eq(rlai_chat_format(RLAI_CHAT_CHATML, NULL, tool, -1, true, &out),
                     RLAI_ERR_INVALID_ARG);
    ck_assert_int_eq(rlai_chat_format((rlai_chat_style)7, NULL, tool, 1, true, &out),
                     RLAI_ERR_INVALID_ARG);
    ck_assert_int_eq(rlai_chat_format(RLAI_CHAT_CHATML, NULL, tool, 1, true, NULL),
                     RLAI_ERR_INVALID_ARG);
}
END_TEST

START_TEST(test_long)
{
    /* many messages and a long content exercise buffer growth */
    enum { N = 200, L = 5000 };
    static char big[L + 1];
    memset(big, 'a', L);
    big[L] = '\0';
    static rlai_chat_message m[N];
    for (int i = 0; i < N; i++) {
        m[i].role = i % 2 ? "assistant" : "user";
        m[i].content = big;
    }
    char *o = fmt(RLAI_CHAT_CHATML, NULL, m, N, true);
    size_t per_user = strlen("<|im_start|>user\n<|im_end|>\n") + L;
    size_t per_asst = strlen("<|im_start|>assistant\n<|im_end|>\n") + L;
    ck_assert_uint_eq(strlen(o),
                      N / 2 * (per_user + per_asst) + strlen("<|im_start|>assistant\n"));
    free(o);
}
END_TEST

static Suite *chat_suite(void)
{
    Suite *s = suite_create("chat");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_detect);
    tcase_add_test(tc, test_default_system);
    tcase_add_test(tc, test_chatml);
    tcase_add_test(tc, test_llama3);
    tcase_add_test(tc, test_gemma);
    tcase_add_test(tc, test_invalid);
    tcase_add_test(tc, test_long);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(chat_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
