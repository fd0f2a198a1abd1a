/* dtype.h - ggml tensor element types: block layouts, sizes, conversion,
 * dequantization and activation quantization (scalar reference code).
 * Layouts follow ggml (see shared/reference/llama-gguf-facts.md §2). */
#ifndef RLAI_DTYPE_H
#define RLAI_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

enum rlai_dtype {
    RLAI_DT_F32 = 0, RLAI_DT_F16 = 1, RLAI_DT_Q4_0 = 2, RLAI_DT_Q4_1 = 3,
    RLAI_DT_Q5_0 = 6, RLAI_DT_Q5_1 = 7, RLAI_DT_Q8_0 = 8, RLAI_DT_Q8_1 = 9,
    RLAI_DT_BF16 = 30,
};

#define RLAI_QK 32   /* elements per block of the 32-element quant types */

typedef struct { uint16_t d; uint8_t qs[16]; } rlai_block_q4_0;             /* 18 B */
typedef struct { uint16_t d, m; uint8_t qs[16]; } rlai_block_q4_1;          /* 20 B */
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; } rlai_block_q5_0; /* 22 B */
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[16]; } rlai_block_q5_1; /* 24 B */
typedef struct { uint16_t d; int8_t qs[32]; } rlai_block_q8_0;              /* 34 B */
typedef struct { uint16_t d, s; int8_t qs[32]; } rlai_block_q8_1;           /* 36 B; s = d * sum(qs) */

/* True for the types this engine can compute with (F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0). */
bool rlai_dtype_supported(uint32_t t);
/* "f32", "q4_1", ...; "unknown" for others. Static string. */
const char *rlai_dtype_name(uint32_t t);
/* Elements per block and bytes per block; 0 for unknown types. */
size_t rlai_dtype_block_elems(uint32_t t);
size_t rlai_dtype_block_bytes(uint32_t t);
/* Bytes of a row of n elements (n must be a multiple of block_elems); 0 if unknown. */
size_t rlai_dtype_row_bytes(uint32_t t, int64_t n);

float rlai_fp16_to_f32(uint16_t h);
uint16_t rlai_f32_to_fp16(float f);      /* round to nearest even */
float rlai_bf16_to_f32(uint16_t h);
uint16_t rlai_f32_to_bf16(float f);      /* round to nearest even, NaN kept quiet */

/* Dequantizes n elements (multiple of the block size) of type t from src
 * into dst (caller-owned). Scalar reference implementation. */
void rlai_dequantize_row(uint32_t t, const void *src, float *dst, int64_t n);

/* Quantizes n f32 values (n % 32 == 0) with the reference quantizer of
 * type t (any supported type, including Q8_1). Used for activations and by
 * tests to build synthetic weights. dst is caller-owned, row_bytes(t, n). */
void rlai_quantize_row(uint32_t t, const float *src, void *dst, int64_t n);

#endif
