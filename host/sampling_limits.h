/* sampling_limits.h - the accepted ranges of the sampling options, in one
 * place: the HTTP front (http.c parse_sampling) and the command line
 * (main.c) both refuse a value outside them, so the two cannot drift.
 * Header only: constants, no object. */
#ifndef RLAI_SAMPLING_LIMITS_H
#define RLAI_SAMPLING_LIMITS_H

#define RLAI_LIM_TEMPERATURE_MIN 0.0
#define RLAI_LIM_TEMPERATURE_MAX 100.0
#define RLAI_LIM_TOP_P_MIN 0.0
#define RLAI_LIM_TOP_P_MAX 1.0
#define RLAI_LIM_MIN_P_MIN 0.0
#define RLAI_LIM_MIN_P_MAX 1.0
#define RLAI_LIM_PENALTY_MIN (-2.0)          /* presence_penalty, frequency_penalty */
#define RLAI_LIM_PENALTY_MAX 2.0
#define RLAI_LIM_REPEAT_PENALTY_MIN 0.0
#define RLAI_LIM_REPEAT_PENALTY_MAX 10.0
#define RLAI_LIM_TOP_K_MIN 0
#define RLAI_LIM_TOP_K_MAX 1000000
#define RLAI_LIM_SPEC_MAX_DRAFT_MIN 1
#define RLAI_LIM_SPEC_MAX_DRAFT_MAX 16

#endif
