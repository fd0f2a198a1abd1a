/* test_gen_params.c - the conversions into the engine's one
 * generation-params type (host/gen_params.h): every field of the wire's
 * rlai_msg_gen and of a plugin's rlai_gen_request lands where it should,
 * and what a request leaves out takes the documented default. */
#include <check.h>
#include <string.h>

#include "gen_params.h"

START_TEST(wire_fields_map_one_to_one_and_absent_ones_take_the_product_defaults)
{
    rlai_msg_gen g;
    memset(&g, 0, sizeof g);
    rlai_gen_params gp;
    rlai_gen_params_from_wire(&g, &gp);          /* nothing sent */
    rlai_gen_params base;
    rlai_gen_params_init(&base);
    rlai_sampler_params prod;
    rlai_sampler_params_product(&prod, 0);
    ck_assert_int_eq(gp.max_tokens, base.max_tokens);
    ck_assert_float_eq(gp.sampling.temperature, prod.temperature);
    ck_assert_int_eq(gp.sampling.top_k, prod.top_k);
    ck_assert_float_eq(gp.sampling.top_p, prod.top_p);
    ck_assert_float_eq(gp.sampling.min_p, prod.min_p);
    ck_assert_int_eq(gp.top_logprobs, base.top_logprobs);
    ck_assert_int_eq(gp.spec, base.spec);
    ck_assert(!gp.ignore_eos);
    ck_assert_ptr_null(gp.logit_bias);
    ck_assert_int_eq(gp.n_logit_bias, 0);
    ck_assert_ptr_null(gp.prediction);
    rlai_gen_params gp2;
    rlai_gen_params_from_wire(&g, &gp2);
    ck_assert(gp.sampling.seed != gp2.sampling.seed);   /* a fresh seed each time */

    g = (rlai_msg_gen){ .max_tokens = 7, .has_max_tokens = true, .temperature = 0.25f, .has_temperature = true,
                        .top_k = 3, .has_top_k = true, .top_p = 0.5f, .has_top_p = true, .min_p = 0.125f,
                        .has_min_p = true, .repeat_penalty = 1.5f, .has_repeat_penalty = true,
                        .presence_penalty = 0.75f, .has_presence_penalty = true, .frequency_penalty = -0.5f,
                        .has_frequency_penalty = true, .seed = 0x123456789abcdef0ull, .has_seed = true,
                        .ignore_eos = true, .timeout_ms = 4321, .has_timeout_ms = true, .spec = RLAI_SPEC_OFF,
                        .has_spec = true, .spec_max_draft = 5, .has_spec_max_draft = true, .top_logprobs = 2,
                        .has_top_logprobs = true };
    rlai_msg_logit_bias lb[2] = { { 42, -100.0f }, { 7, 1.5f } };
    g.logit_bias = lb;
    g.n_logit_bias = 2;
    char pred[] = "int count = 0;";
    g.prediction = pred;
    rlai_gen_params_from_wire(&g, &gp);
    ck_assert_ptr_eq(gp.prediction, pred);    /* borrowed from the message */
    ck_assert_int_eq(gp.n_logit_bias, 2);
    ck_assert_int_eq(gp.logit_bias[0].token, 42);
    ck_assert_float_eq(gp.logit_bias[0].bias, -100.0f);
    ck_assert_int_eq(gp.logit_bias[1].token, 7);
    ck_assert_float_eq(gp.logit_bias[1].bias, 1.5f);
    ck_assert_int_eq(gp.max_tokens, 7);
    ck_assert_float_eq(gp.sampling.temperature, 0.25f);
    ck_assert_int_eq(gp.sampling.top_k, 3);
    ck_assert_float_eq(gp.sampling.top_p, 0.5f);
    ck_assert_float_eq(gp.sampling.min_p, 0.125f);
    ck_assert_float_eq(gp.sampling.repeat_penalty, 1.5f);
    ck_assert_float_eq(gp.sampling.presence_penalty, 0.75f);
    ck_assert_float_eq(gp.sampling.frequency_penalty, -0.5f);
    ck_assert_uint_eq(gp.sampling.seed, 0x123456789abcdef0ull);
    ck_assert(gp.ignore_eos);
    ck_assert_int_eq(gp.timeout_ms, 4321);
    ck_assert_int_eq(gp.spec, RLAI_SPEC_OFF);
    ck_assert_int_eq(gp.spec_max_draft, 5);
    ck_assert_int_eq(gp.top_logprobs, 2);
    ck_assert_ptr_null(gp.stop);
}
END_TEST

START_TEST(plugin_fields_follow_the_zero_means_off_rules)
{
    rlai_gen_request req;
    memset(&req, 0, sizeof req);
    rlai_gen_params gp, base;
    rlai_gen_params_init(&base);
    rlai_gen_params_from_plugin(&req, &gp);      /* all zero */
    ck_assert_int_eq(gp.max_tokens, base.max_tokens);
    ck_assert_float_eq(gp.sampling.temperature, 0);   /* greedy */
    ck_assert_int_eq(gp.sampling.top_k, 0);
    ck_assert_float_eq(gp.sampling.top_p, base.sampling.top_p);
    ck_assert_float_eq(gp.sampling.min_p, base.sampling.min_p);
    ck_assert_float_eq(gp.sampling.repeat_penalty, base.sampling.repeat_penalty);
    ck_assert_uint_eq(gp.sampling.seed, 0);

    const char *stops[] = { "END", NULL };
    req = (rlai_gen_request){ .max_tokens = 9, .temperature = 0.7f, .top_k = 11, .top_p = 0.9f, .min_p = 0.2f,
                              .repeat_penalty = 1.25f, .seed = 42, .stop = stops };
    rlai_gen_params_from_plugin(&req, &gp);
    ck_assert_int_eq(gp.max_tokens, 9);
    ck_assert_float_eq(gp.sampling.temperature, 0.7f);
    ck_assert_int_eq(gp.sampling.top_k, 11);
    ck_assert_float_eq(gp.sampling.top_p, 0.9f);
    ck_assert_float_eq(gp.sampling.min_p, 0.2f);
    ck_assert_float_eq(gp.sampling.repeat_penalty, 1.25f);
    ck_assert_uint_eq(gp.sampling.seed, 42);
    ck_assert_ptr_eq(gp.stop, stops);             /* borrowed, not copied */
    req.top_p = 1.5f;                             /* >= 1 is off */
    req.temperature = -1;                         /* negative is greedy */
    req.top_k = -4;
    rlai_gen_params_from_plugin(&req, &gp);
    ck_assert_float_eq(gp.sampling.top_p, base.sampling.top_p);
    ck_assert_float_eq(gp.sampling.temperature, 0);
    ck_assert_int_eq(gp.sampling.top_k, 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("gen_params");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, wire_fields_map_one_to_one_and_absent_ones_take_the_product_defaults);
    tcase_add_test(tc, plugin_fields_follow_the_zero_means_off_rules);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
