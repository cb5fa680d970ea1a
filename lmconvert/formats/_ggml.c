/* lmconvert's C kernels for GGML's quantized blocks: GGUF-in dequantization and llama.cpp's K-quant
 * encoders, called from Python with the GIL released (the readers and writers spread bands over
 * threads). Built by setup.py with -ffp-contract=off and without -ffast-math: every float operation
 * below is rounded on its own, in the order written, as the references round them.
 *
 * Dequantization gives bit for bit the float32 values of gguf-py's numpy `gguf.quants.dequantize`
 * (the code transformers' GGUF loader runs): each value is the same chain of float32 products and
 * differences in the same order (Q4_K: (d * sc) * q - dmin * m), and with finite float16 fields
 * nothing overflows, so IEEE rounding fixes every bit. A block whose float16 fields hold an Inf or
 * NaN is only counted here: which NaN payload survives `NaN - NaN` depends on operand order inside
 * numpy's kernels, so ggml_dequant.py hands those blocks to gguf's own code.
 *
 * The K-quant encoders (from "K-quants, as llama.cpp encodes them" on) are llama.cpp's reference
 * quantizers, quantize_row_q{2..6}_K_ref and their helpers, copied unchanged (but for `static` and
 * the asserts) from ggml/src/ggml-quants.c of llama.cpp as vendored by llama-cpp-python 0.3.36:
 *
 *   MIT License
 *
 *   Copyright (c) 2023-2026 The ggml authors
 *
 *   Permission is hereby granted, free of charge, to any person obtaining a copy of this software and
 *   associated documentation files (the "Software"), to deal in the Software without restriction,
 *   including without limitation the rights to use, copy, modify, merge, publish, distribute,
 *   sublicense, and/or sell copies of the Software, and to permit persons to whom the Software is
 *   furnished to do so, subject to the following conditions:
 *
 *   The above copyright notice and this permission notice shall be included in all copies or
 *   substantial portions of the Software.
 *
 *   THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT
 *   NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND
 *   NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM,
 *   DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT
 *   OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.
 *
 * ggml-quants.c is compiled into libggml-base for the baseline ISA (no FMA), as is this file, so the
 * bytes match llama_model_quantize's; tests/test_kquants.py checks them against it.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "GGUF's blocks are little-endian; lmconvert's C kernels read them in place"
#endif
#if defined(__FAST_MATH__)
#error "lmconvert/formats/_ggml.c must be compiled without -ffast-math: its results are bit for bit the references'"
#endif

#define QK_K 256
#define K_SCALE_SIZE 12
#define GROUP_MAX_EPS 1e-15f
#define GGML_RESTRICT restrict
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

typedef uint16_t ggml_half;

/* ggml-impl.h's conversions (https://github.com/Maratyszcza/FP16), which ggml-base uses */
static inline float fp32_from_bits(uint32_t w) { float f; memcpy(&f, &w, 4); return f; }
static inline uint32_t fp32_to_bits(float f) { uint32_t w; memcpy(&w, &f, 4); return w; }

static inline float ggml_compute_fp16_to_fp32(ggml_half h) {
    const uint32_t w = (uint32_t) h << 16;
    const uint32_t sign = w & UINT32_C(0x80000000);
    const uint32_t two_w = w + w;

    const uint32_t exp_offset = UINT32_C(0xE0) << 23;
    const float exp_scale = 0x1.0p-112f;
    const float normalized_value = fp32_from_bits((two_w >> 4) + exp_offset) * exp_scale;

    const uint32_t magic_mask = UINT32_C(126) << 23;
    const float magic_bias = 0.5f;
    const float denormalized_value = fp32_from_bits((two_w >> 17) | magic_mask) - magic_bias;

    const uint32_t denormalized_cutoff = UINT32_C(1) << 27;
    const uint32_t result = sign |
        (two_w < denormalized_cutoff ? fp32_to_bits(denormalized_value) : fp32_to_bits(normalized_value));
    return fp32_from_bits(result);
}

static inline ggml_half ggml_compute_fp32_to_fp16(float f) {
    const float scale_to_inf = 0x1.0p+112f;
    const float scale_to_zero = 0x1.0p-110f;
    float base = (fabsf(f) * scale_to_inf) * scale_to_zero;

    const uint32_t w = fp32_to_bits(f);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & UINT32_C(0x80000000);
    uint32_t bias = shl1_w & UINT32_C(0xFF000000);
    if (bias < UINT32_C(0x71000000)) {
        bias = UINT32_C(0x71000000);
    }

    base = fp32_from_bits((bias >> 1) + UINT32_C(0x07800000)) + base;
    const uint32_t bits = fp32_to_bits(base);
    const uint32_t exp_bits = (bits >> 13) & UINT32_C(0x00007C00);
    const uint32_t mantissa_bits = bits & UINT32_C(0x00000FFF);
    const uint32_t nonsign = exp_bits + mantissa_bits;
    return (sign >> 16) | (shl1_w > UINT32_C(0xFF000000) ? UINT16_C(0x7E00) : nonsign);
}

#define GGML_FP16_TO_FP32(x) ggml_compute_fp16_to_fp32(x)
#define GGML_FP32_TO_FP16(x) ggml_compute_fp32_to_fp16(x)

/* ggml-common.h's super-blocks (the unions of d and dmin flattened) */
typedef struct { uint8_t scales[QK_K/16]; uint8_t qs[QK_K/4]; ggml_half d; ggml_half dmin; } block_q2_K;
typedef struct { uint8_t hmask[QK_K/8]; uint8_t qs[QK_K/4]; uint8_t scales[12]; ggml_half d; } block_q3_K;
typedef struct { ggml_half d; ggml_half dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K/2]; } block_q4_K;
typedef struct {
    ggml_half d; ggml_half dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[QK_K/8]; uint8_t qs[QK_K/2];
} block_q5_K;
typedef struct { uint8_t ql[QK_K/2]; uint8_t qh[QK_K/4]; int8_t scales[QK_K/16]; ggml_half d; } block_q6_K;
_Static_assert(sizeof(block_q2_K) == 84, "q2_K block size");
_Static_assert(sizeof(block_q3_K) == 110, "q3_K block size");
_Static_assert(sizeof(block_q4_K) == 144, "q4_K block size");
_Static_assert(sizeof(block_q5_K) == 176, "q5_K block size");
_Static_assert(sizeof(block_q6_K) == 210, "q6_K block size");

/* ======================= Dequantization, as gguf-py's numpy computes it ======================= */

/* A little-endian float16 field at b: its bits. */
static inline uint16_t half_at(const uint8_t *b) { uint16_t h; memcpy(&h, b, 2); return h; }

/* Inf or NaN: every exponent bit set. */
static inline int not_finite(uint16_t h) { return (h & 0x7C00) == 0x7C00; }

static inline float f16_at(const uint8_t *b) { return ggml_compute_fp16_to_fp32(half_at(b)); }

/* Each kernel: n blocks at b into 32 or 256 float32 values each at y; returns how many blocks have an
 * Inf or NaN float16 field (their values are left for gguf's code). */
typedef Py_ssize_t (*dequant_fn)(const uint8_t *b, float *y, Py_ssize_t n);

static Py_ssize_t dq_q8_0(const uint8_t *b, float *restrict y, Py_ssize_t n) {
    Py_ssize_t bad = 0;
    for (Py_ssize_t i = 0; i < n; i++, b += 34, y += 32) {
        bad += not_finite(half_at(b));
        const float d = f16_at(b);
        const int8_t *q = (const int8_t *)(b + 2);
        for (int l = 0; l < 32; l++) y[l] = (float)q[l] * d;  /* gguf: x * d */
    }
    return bad;
}

/* Q4_0/Q4_1: the low nibbles of the 16 bytes at qs are values 0..15, the high ones 16..31. */
static Py_ssize_t dq_q4_0(const uint8_t *b, float *restrict y, Py_ssize_t n) {
    Py_ssize_t bad = 0;
    for (Py_ssize_t i = 0; i < n; i++, b += 18, y += 32) {
        bad += not_finite(half_at(b));
        const float d = f16_at(b);
        const uint8_t *qs = b + 2;
        for (int l = 0; l < 16; l++) {
            y[l] = d * (float)((int)(qs[l] & 0x0F) - 8);  /* gguf: d * (int8(q) - 8) */
            y[l + 16] = d * (float)((int)(qs[l] >> 4) - 8);
        }
    }
    return bad;
}

static Py_ssize_t dq_q4_1(const uint8_t *b, float *restrict y, Py_ssize_t n) {
    Py_ssize_t bad = 0;
    for (Py_ssize_t i = 0; i < n; i++, b += 20, y += 32) {
        bad += not_finite(half_at(b)) | not_finite(half_at(b + 2));
        const float d = f16_at(b), m = f16_at(b + 2);
        const uint8_t *qs = b + 4;
        for (int l = 0; l < 16; l++) {
            y[l] = d * (float)(qs[l] & 0x0F) + m;  /* gguf: d * q + m */
            y[l + 16] = d * (float)(qs[l] >> 4) + m;
        }
    }
    return bad;
}

/* Q5_0/Q5_1: nibbles as Q4's, and bit l of the little-endian uint32 at qh is value l's fifth bit,
 * found by a mask per value (a table, so that the loops vectorize). */
static const uint32_t BIT[32] = {
    1u << 0, 1u << 1, 1u << 2, 1u << 3, 1u << 4, 1u << 5, 1u << 6, 1u << 7, 1u << 8, 1u << 9, 1u << 10,
    1u << 11, 1u << 12, 1u << 13, 1u << 14, 1u << 15, 1u << 16, 1u << 17, 1u << 18, 1u << 19, 1u << 20,
    1u << 21, 1u << 22, 1u << 23, 1u << 24, 1u << 25, 1u << 26, 1u << 27, 1u << 28, 1u << 29, 1u << 30, 1u << 31,
};

static inline uint32_t u32_at(const uint8_t *b) { uint32_t v; memcpy(&v, b, 4); return v; }

/* the 32 values of a Q5 block, 0..31 */
static inline void five_bits(uint32_t qh, const uint8_t *qs, int32_t *restrict q) {
    for (int l = 0; l < 16; l++) q[l] = (qs[l] & 0x0F) | ((qh & BIT[l]) ? 16 : 0);
    for (int l = 0; l < 16; l++) q[l + 16] = (qs[l] >> 4) | ((qh & BIT[l + 16]) ? 16 : 0);
}

static Py_ssize_t dq_q5_0(const uint8_t *b, float *restrict y, Py_ssize_t n) {
    Py_ssize_t bad = 0;
    int32_t q[32];
    for (Py_ssize_t i = 0; i < n; i++, b += 22, y += 32) {
        bad += not_finite(half_at(b));
        const float d = f16_at(b);
        five_bits(u32_at(b + 2), b + 6, q);
        for (int l = 0; l < 32; l++) y[l] = d * (float)(q[l] - 16);  /* gguf: d * (int8(q) - 16) */
    }
    return bad;
}

static Py_ssize_t dq_q5_1(const uint8_t *b, float *restrict y, Py_ssize_t n) {
    Py_ssize_t bad = 0;
    int32_t q[32];
    for (Py_ssize_t i = 0; i < n; i++, b += 24, y += 32) {
        bad += not_finite(half_at(b)) | not_finite(half_at(b + 2));
        const float d = f16_at(b), m = f16_at(b + 2);
        five_bits(u32_at(b + 4), b + 8, q);
        for (int l = 0; l < 32; l++) y[l] = d * (float)q[l] + m;  /* gguf: d * q + m */
    }
    return bad;
}

/* Q2_K: 16 scale bytes (low nibble the scale, high the min), then 2-bit quants: byte 32r + l of the
 * 64 holds values 128r + 32s + l in its bits 2s; d and dmin at 80. */
static Py_ssize_t dq_q2_k(const uint8_t *b, float *restrict y, Py_ssize_t n) {
    Py_ssize_t bad = 0;
    for (Py_ssize_t i = 0; i < n; i++, b += 84, y += QK_K) {
        bad += not_finite(half_at(b + 80)) | not_finite(half_at(b + 82));
        const float d = f16_at(b + 80), dmin = f16_at(b + 82);
        for (int j = 0; j < 16; j++) {
            const float dl = d * (float)(b[j] & 0x0F), ml = dmin * (float)(b[j] >> 4);
            const int r = j / 8, s = (j / 2) % 4, l0 = 16 * (j % 2);
            const uint8_t *qs = b + 16 + 32 * r + l0;
            float *out = y + 16 * j;
            for (int l = 0; l < 16; l++) out[l] = dl * (float)((qs[l] >> (2 * s)) & 3) - ml;  /* gguf: dl * q - ml */
        }
    }
    return bad;
}

/* Q3_K: hmask (bit k of byte l: value 32k + l's high bit, clear meaning -4), 2-bit quants as Q2_K's,
 * twelve bytes of 6-bit scales, d at 108. */
static Py_ssize_t dq_q3_k(const uint8_t *b, float *restrict y, Py_ssize_t n) {
    Py_ssize_t bad = 0;
    for (Py_ssize_t i = 0; i < n; i++, b += 110, y += QK_K) {
        bad += not_finite(half_at(b + 108));
        const float d = f16_at(b + 108);
        const uint8_t *hm = b, *s = b + 96;
        for (int j = 0; j < 16; j++) {
            const int lo = j < 8 ? s[j] & 0x0F : s[j - 8] >> 4;
            const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
            const float dl = d * (float)((int8_t)(lo | (hi << 4)) - 32);  /* gguf: d * (int8(sc) - 32) */
            const int r = j / 8, sh = (j / 2) % 4, l0 = 16 * (j % 2);
            const uint8_t *qs = b + 32 + 32 * r + l0;
            const int k = j / 2;  /* value 16j + l is 32k + (l0 + l) */
            float *out = y + 16 * j;
            for (int l = 0; l < 16; l++) {
                const int q = ((qs[l] >> (2 * sh)) & 3) - (((hm[l0 + l] >> k) & 1) ? 0 : 4);
                out[l] = dl * (float)q;  /* gguf: dl * q */
            }
        }
    }
    return bad;
}

/* Q4_K/Q5_K's 6-bit scale and min of sub-block j (ggml's get_scale_min_k4). */
static inline void scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63; *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Q4_K: d, dmin, 12 scale bytes, then nibbles: byte 32c + l holds value 64c + l low, 64c + 32 + l high. */
static Py_ssize_t dq_q4_k(const uint8_t *b, float *restrict y, Py_ssize_t n) {
    Py_ssize_t bad = 0;
    for (Py_ssize_t i = 0; i < n; i++, b += 144, y += QK_K) {
        bad += not_finite(half_at(b)) | not_finite(half_at(b + 2));
        const float d = f16_at(b), dmin = f16_at(b + 2);
        for (int j = 0; j < 8; j++) {
            int sc, m;
            scale_min_k4(j, b + 4, &sc, &m);
            const float dl = d * (float)sc, ml = dmin * (float)m;
            const uint8_t *qs = b + 16 + 32 * (j / 2);
            const int shift = 4 * (j % 2);
            float *out = y + 32 * j;
            for (int l = 0; l < 32; l++) out[l] = dl * (float)((qs[l] >> shift) & 0x0F) - ml;  /* (d*sc)*q - dmin*m */
        }
    }
    return bad;
}

/* Q5_K: as Q4_K, with 32 bytes of high bits at 16 (bit j of byte l: value 32j + l) before the nibbles. */
static Py_ssize_t dq_q5_k(const uint8_t *b, float *restrict y, Py_ssize_t n) {
    Py_ssize_t bad = 0;
    for (Py_ssize_t i = 0; i < n; i++, b += 176, y += QK_K) {
        bad += not_finite(half_at(b)) | not_finite(half_at(b + 2));
        const float d = f16_at(b), dmin = f16_at(b + 2);
        const uint8_t *qh = b + 16;
        for (int j = 0; j < 8; j++) {
            int sc, m;
            scale_min_k4(j, b + 4, &sc, &m);
            const float dl = d * (float)sc, ml = dmin * (float)m;
            const uint8_t *qs = b + 48 + 32 * (j / 2);
            const int shift = 4 * (j % 2);
            float *out = y + 32 * j;
            for (int l = 0; l < 32; l++) {
                const int q = ((qs[l] >> shift) & 0x0F) | (((qh[l] >> j) & 1) << 4);
                out[l] = dl * (float)q - ml;
            }
        }
    }
    return bad;
}

/* Q6_K: nibbles (byte 64r + l: value 128r + l low, 128r + 64 + l high), 2-bit highs (byte 32r + l:
 * value 128r + 32s + l in bits 2s), 16 int8 scales, d at 208. */
static Py_ssize_t dq_q6_k(const uint8_t *b, float *restrict y, Py_ssize_t n) {
    Py_ssize_t bad = 0;
    for (Py_ssize_t i = 0; i < n; i++, b += 210, y += QK_K) {
        bad += not_finite(half_at(b + 208));
        const float d = f16_at(b + 208);
        const int8_t *sc = (const int8_t *)(b + 192);
        for (int j = 0; j < 16; j++) {
            const float dl = d * (float)sc[j];
            const int r = j / 8, v = 16 * (j % 8);  /* value 128r + v + l */
            const uint8_t *ql = b + 64 * r + (v % 64);
            const int nib = 4 * (v / 64);
            const uint8_t *qh = b + 128 + 32 * r + (v % 32);
            const int hs = 2 * (v / 32);
            float *out = y + 16 * j;
            for (int l = 0; l < 16; l++) {
                const int q = (((ql[l] >> nib) & 0x0F) | (((qh[l] >> hs) & 3) << 4)) - 32;
                out[l] = dl * (float)q;  /* gguf: (d * sc) * q */
            }
        }
    }
    return bad;
}

/* ====================== K-quants, as llama.cpp encodes them (ggml-quants.c) ====================== */

static inline int nearest_int(float fval) {
    float val = fval + 12582912.f;
    int i; memcpy(&i, &val, sizeof(int));
    return (i & 0x007fffff) - 0x00400000;
}

static float make_qx_quants(int n, int nmax, const float * GGML_RESTRICT x, int8_t * GGML_RESTRICT L, int rmse_type,
        const float * GGML_RESTRICT qw) {
    float max = 0;
    float amax = 0;
    for (int i = 0; i < n; ++i) {
        float ax = fabsf(x[i]);
        if (ax > amax) { amax = ax; max = x[i]; }
    }
    if (amax < GROUP_MAX_EPS) { // all zero
        for (int i = 0; i < n; ++i) {
            L[i] = 0;
        }
        return 0.f;
    }
    float iscale = -nmax / max;
    if (rmse_type == 0) {
        for (int i = 0; i < n; ++i) {
            int l = nearest_int(iscale * x[i]);
            L[i] = nmax + MAX(-nmax, MIN(nmax-1, l));
        }
        return 1/iscale;
    }
    bool return_early = false;
    if (rmse_type < 0) {
        rmse_type = -rmse_type;
        return_early = true;
    }
    float sumlx = 0;
    float suml2 = 0;
    for (int i = 0; i < n; ++i) {
        int l = nearest_int(iscale * x[i]);
        l = MAX(-nmax, MIN(nmax-1, l));
        L[i] = l + nmax;
        float w = qw ? qw[i] : rmse_type == 1 ? x[i] * x[i] : rmse_type == 2 ? 1 : rmse_type == 3 ? fabsf(x[i]) : sqrtf(fabsf(x[i]));
        sumlx += w*x[i]*l;
        suml2 += w*l*l;
    }
    float scale = suml2 ? sumlx/suml2 : 0.0f;
    if (return_early) return suml2 > 0 ? 0.5f*(scale + 1/iscale) : 1/iscale;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; ++is) {
        if (is == 0) {
            continue;
        }
        iscale = -(nmax + 0.1f*is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; ++i) {
            int l = nearest_int(iscale * x[i]);
            l = MAX(-nmax, MIN(nmax-1, l));
            float w = qw ? qw[i] : rmse_type == 1 ? x[i] * x[i] : rmse_type == 2 ? 1 : rmse_type == 3 ? fabsf(x[i]) : sqrtf(fabsf(x[i]));
            sumlx += w*x[i]*l;
            suml2 += w*l*l;
        }
        if (suml2 > 0 && sumlx*sumlx > best*suml2) {
            for (int i = 0; i < n; ++i) {
                int l = nearest_int(iscale * x[i]);
                L[i] = nmax + MAX(-nmax, MIN(nmax-1, l));
            }
            scale = sumlx/suml2; best = scale*sumlx;
        }
    }
    return scale;
}

static float make_q3_quants(int n, int nmax, const float * GGML_RESTRICT x, int8_t * GGML_RESTRICT L, bool do_rmse) {
    float max = 0;
    float amax = 0;
    for (int i = 0; i < n; ++i) {
        float ax = fabsf(x[i]);
        if (ax > amax) { amax = ax; max = x[i]; }
    }
    if (amax < GROUP_MAX_EPS) { // all zero
        for (int i = 0; i < n; ++i) { L[i] = 0; }
        return 0.f;
    }
    float iscale = -nmax / max;
    if (do_rmse) {
        float sumlx = 0;
        float suml2 = 0;
        for (int i = 0; i < n; ++i) {
            int l = nearest_int(iscale * x[i]);
            l = MAX(-nmax, MIN(nmax-1, l));
            L[i] = l;
            float w = x[i]*x[i];
            sumlx += w*x[i]*l;
            suml2 += w*l*l;
        }
        for (int itry = 0; itry < 5; ++itry) {
            int n_changed = 0;
            for (int i = 0; i < n; ++i) {
                float w = x[i]*x[i];
                float slx = sumlx - w*x[i]*L[i];
                if (slx > 0) {
                    float sl2 = suml2 - w*L[i]*L[i];
                    int new_l = nearest_int(x[i] * sl2 / slx);
                    new_l = MAX(-nmax, MIN(nmax-1, new_l));
                    if (new_l != L[i]) {
                        slx += w*x[i]*new_l;
                        sl2 += w*new_l*new_l;
                        if (sl2 > 0 && slx*slx*suml2 > sumlx*sumlx*sl2) {
                            L[i] = new_l; sumlx = slx; suml2 = sl2;
                            ++n_changed;
                        }
                    }
                }
            }
            if (!n_changed) {
                break;
            }
        }
        for (int i = 0; i < n; ++i) {
            L[i] += nmax;
        }
        return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
    }
    for (int i = 0; i < n; ++i) {
        int l = nearest_int(iscale * x[i]);
        l = MAX(-nmax, MIN(nmax-1, l));
        L[i] = l + nmax;
    }
    return 1/iscale;
}

static float make_qkx2_quants(int n, int nmax, const float * GGML_RESTRICT x, const float * GGML_RESTRICT weights,
        uint8_t * GGML_RESTRICT L, float * GGML_RESTRICT the_min, uint8_t * GGML_RESTRICT Laux,
        float rmin, float rdelta, int nstep, bool use_mad) {
    float min = x[0];
    float max = x[0];
    float sum_w = weights[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax/(max - min);
    float scale = 1/iscale;
    float best_error = 0;
    for (int i = 0; i < n; ++i) {
        int l = nearest_int(iscale*(x[i] - min));
        L[i] = MAX(0, MIN(nmax, l));
        float diff = scale * L[i] + min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        float w = weights[i];
        best_error += w * diff;
    }
    if (nstep < 1) {
        *the_min = -min;
        return scale;
    }
    for (int is = 0; is <= nstep; ++is) {
        iscale = (rmin + rdelta*is + nmax)/(max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; ++i) {
            int l = nearest_int(iscale*(x[i] - min));
            l = MAX(0, MIN(nmax, l));
            Laux[i] = l;
            float w = weights[i];
            sum_l += w*l;
            sum_l2 += w*l*l;
            sum_xl += w*l*x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l)/D;
            float this_min   = (sum_l2 * sum_x - sum_l * sum_xl)/D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; ++i) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                diff = use_mad ? fabsf(diff) : diff * diff;
                float w = weights[i];
                cur_error += w * diff;
            }
            if (cur_error < best_error) {
                for (int i = 0; i < n; ++i) {
                    L[i] = Laux[i];
                }
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

static inline void get_scale_min_k4(int j, const uint8_t * GGML_RESTRICT q, uint8_t * GGML_RESTRICT d, uint8_t * GGML_RESTRICT m) {
    if (j < 4) {
        *d = q[j] & 63; *m = q[j + 4] & 63;
    } else {
        *d = (q[j+4] & 0xF) | ((q[j-4] >> 6) << 4);
        *m = (q[j+4] >>  4) | ((q[j-0] >> 6) << 4);
    }
}

static void quantize_row_q2_K_ref(const float * GGML_RESTRICT x, block_q2_K * GGML_RESTRICT y, int64_t k) {
    const int nb = k / QK_K;

    uint8_t L[QK_K];
    uint8_t Laux[16];
    float   weights[16];
    float mins[QK_K/16];
    float scales[QK_K/16];

    const float q4scale = 15.f;

    for (int i = 0; i < nb; i++) {
        float max_scale = 0; // as we are deducting the min, scales are always positive
        float max_min = 0;
        for (int j = 0; j < QK_K/16; ++j) {
            for (int l = 0; l < 16; ++l) weights[l] = fabsf(x[16*j + l]);
            scales[j] = make_qkx2_quants(16, 3, x + 16*j, weights, L + 16*j, &mins[j], Laux, -0.5f, 0.1f, 15, true);
            float scale = scales[j];
            if (scale > max_scale) {
                max_scale = scale;
            }
            float min = mins[j];
            if (min > max_min) {
                max_min = min;
            }
        }

        if (max_scale > 0) {
            float iscale = q4scale/max_scale;
            for (int j = 0; j < QK_K/16; ++j) {
                int l = nearest_int(iscale*scales[j]);
                y[i].scales[j] = l;
            }
            y[i].d = GGML_FP32_TO_FP16(max_scale/q4scale);
        } else {
            for (int j = 0; j < QK_K/16; ++j) y[i].scales[j] = 0;
            y[i].d = GGML_FP32_TO_FP16(0.f);
        }
        if (max_min > 0) {
            float iscale = q4scale/max_min;
            for (int j = 0; j < QK_K/16; ++j) {
                int l = nearest_int(iscale*mins[j]);
                y[i].scales[j] |= (l << 4);
            }
            y[i].dmin = GGML_FP32_TO_FP16(max_min/q4scale);
        } else {
            y[i].dmin = GGML_FP32_TO_FP16(0.f);
        }
        for (int j = 0; j < QK_K/16; ++j) {
            const float d = GGML_FP16_TO_FP32(y[i].d) * (y[i].scales[j] & 0xF);
            if (!d) continue;
            const float dm = GGML_FP16_TO_FP32(y[i].dmin) * (y[i].scales[j] >> 4);
            for (int ii = 0; ii < 16; ++ii) {
                int l = nearest_int((x[16*j + ii] + dm)/d);
                l = MAX(0, MIN(3, l));
                L[16*j + ii] = l;
            }
        }

        for (int j = 0; j < QK_K; j += 128) {
            for (int l = 0; l < 32; ++l) {
                y[i].qs[j/4 + l] = L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6);
            }
        }

        x += QK_K;
    }
}

static void quantize_row_q3_K_ref(const float * GGML_RESTRICT x, block_q3_K * GGML_RESTRICT y, int64_t k) {
    const int nb = k / QK_K;

    int8_t L[QK_K];
    float scales[QK_K / 16];

    for (int i = 0; i < nb; i++) {

        float max_scale = 0;
        float amax = 0;
        for (int j = 0; j < QK_K/16; ++j) {
            scales[j] = make_q3_quants(16, 4, x + 16*j, L + 16*j, true);
            float scale = fabsf(scales[j]);
            if (scale > amax) {
                amax = scale; max_scale = scales[j];
            }
        }

        memset(y[i].scales, 0, 12);
        if (max_scale) {
            float iscale = -32.f/max_scale;
            for (int j = 0; j < QK_K/16; ++j) {
                int8_t l = nearest_int(iscale*scales[j]);
                l = MAX(-32, MIN(31, l)) + 32;
                if (j < 8) {
                    y[i].scales[j] = l & 0xF;
                } else {
                    y[i].scales[j-8] |= ((l & 0xF) << 4);
                }
                l >>= 4;
                y[i].scales[j%4 + 8] |= (l << (2*(j/4)));
            }
            y[i].d = GGML_FP32_TO_FP16(1/iscale);
        } else {
            y[i].d = GGML_FP32_TO_FP16(0.f);
        }

        int8_t sc;
        for (int j = 0; j < QK_K/16; ++j) {
            sc = j < 8 ? y[i].scales[j] & 0xF : y[i].scales[j-8] >> 4;
            sc = (sc | (((y[i].scales[8 + j%4] >> (2*(j/4))) & 3) << 4)) - 32;
            float d = GGML_FP16_TO_FP32(y[i].d) * sc;
            if (!d) {
                continue;
            }
            for (int ii = 0; ii < 16; ++ii) {
                int l = nearest_int(x[16*j + ii]/d);
                l = MAX(-4, MIN(3, l));
                L[16*j + ii] = l + 4;
            }
        }

        memset(y[i].hmask, 0, QK_K/8);
        // We put the high-bit for the 1st 8 quants into bit 0, the next 8 into bit 1, etc.
        int m = 0;
        uint8_t hm = 1;
        for (int j = 0; j < QK_K; ++j) {
            if (L[j] > 3) {
                y[i].hmask[m] |= hm;
                L[j] -= 4;
            }
            if (++m == QK_K/8) {
                m = 0; hm <<= 1;
            }
        }
        for (int j = 0; j < QK_K; j += 128) {
            for (int l = 0; l < 32; ++l) {
                y[i].qs[j/4 + l] = L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6);
            }
        }

        x += QK_K;
    }
}

static void quantize_row_q4_K_ref(const float * GGML_RESTRICT x, block_q4_K * GGML_RESTRICT y, int64_t k) {
    const int nb = k / QK_K;

    uint8_t L[QK_K];
    uint8_t Laux[32];
    float   weights[32];
    float mins[QK_K/32];
    float scales[QK_K/32];

    for (int i = 0; i < nb; i++) {
        float max_scale = 0; // as we are deducting the min, scales are always positive
        float max_min = 0;
        for (int j = 0; j < QK_K/32; ++j) {
            //scales[j] = make_qkx1_quants(32, 15, x + 32*j, L + 32*j, &mins[j], 9, 0.5f);
            float sum_x2 = 0;
            for (int l = 0; l < 32; ++l) sum_x2 += x[32*j + l] * x[32*j + l];
            float av_x = sqrtf(sum_x2/32);
            for (int l = 0; l < 32; ++l) weights[l] = av_x + fabsf(x[32*j + l]);
            scales[j] = make_qkx2_quants(32, 15, x + 32*j, weights, L + 32*j, &mins[j], Laux, -1.f, 0.1f, 20, false);
            float scale = scales[j];
            if (scale > max_scale) {
                max_scale = scale;
            }
            float min = mins[j];
            if (min > max_min) {
                max_min = min;
            }
        }

        float inv_scale = max_scale > 0 ? 63.f/max_scale : 0.f;
        float inv_min   = max_min   > 0 ? 63.f/max_min   : 0.f;
        for (int j = 0; j < QK_K/32; ++j) {
            uint8_t ls = nearest_int(inv_scale*scales[j]);
            uint8_t lm = nearest_int(inv_min*mins[j]);
            ls = MIN(63, ls);
            lm = MIN(63, lm);
            if (j < 4) {
                y[i].scales[j] = ls;
                y[i].scales[j+4] = lm;
            } else {
                y[i].scales[j+4] = (ls & 0xF) | ((lm & 0xF) << 4);
                y[i].scales[j-4] |= ((ls >> 4) << 6);
                y[i].scales[j-0] |= ((lm >> 4) << 6);
            }
        }
        y[i].d = GGML_FP32_TO_FP16(max_scale/63.f);
        y[i].dmin = GGML_FP32_TO_FP16(max_min/63.f);

        uint8_t sc, m;
        for (int j = 0; j < QK_K/32; ++j) {
            get_scale_min_k4(j, y[i].scales, &sc, &m);
            const float d = GGML_FP16_TO_FP32(y[i].d) * sc;
            if (!d) continue;
            const float dm = GGML_FP16_TO_FP32(y[i].dmin) * m;
            for (int ii = 0; ii < 32; ++ii) {
                int l = nearest_int((x[32*j + ii] + dm)/d);
                l = MAX(0, MIN(15, l));
                L[32*j + ii] = l;
            }
        }

        uint8_t * q = y[i].qs;
        for (int j = 0; j < QK_K; j += 64) {
            for (int l = 0; l < 32; ++l) q[l] = L[j + l] | (L[j + l + 32] << 4);
            q += 32;
        }

        x += QK_K;
    }
}

static void quantize_row_q5_K_ref(const float * GGML_RESTRICT x, block_q5_K * GGML_RESTRICT y, int64_t k) {
    const int64_t nb = k / QK_K;

    uint8_t L[QK_K];
    float mins[QK_K/32];
    float scales[QK_K/32];
    float weights[32];
    uint8_t Laux[32];

    for (int i = 0; i < nb; i++) {
        float max_scale = 0; // as we are deducting the min, scales are always positive
        float max_min = 0;
        for (int j = 0; j < QK_K/32; ++j) {
            //scales[j] = make_qkx1_quants(32, 31, x + 32*j, L + 32*j, &mins[j], 9, 0.5f);
            float sum_x2 = 0;
            for (int l = 0; l < 32; ++l) sum_x2 += x[32*j + l] * x[32*j + l];
            float av_x = sqrtf(sum_x2/32);
            for (int l = 0; l < 32; ++l) weights[l] = av_x + fabsf(x[32*j + l]);
            scales[j] = make_qkx2_quants(32, 31, x + 32*j, weights, L + 32*j, &mins[j], Laux, -0.5f, 0.1f, 15, false);
            float scale = scales[j];
            if (scale > max_scale) {
                max_scale = scale;
            }
            float min = mins[j];
            if (min > max_min) {
                max_min = min;
            }
        }

        float inv_scale = max_scale > 0 ? 63.f/max_scale : 0.f;
        float inv_min   = max_min   > 0 ? 63.f/max_min   : 0.f;
        for (int j = 0; j < QK_K/32; ++j) {
            uint8_t ls = nearest_int(inv_scale*scales[j]);
            uint8_t lm = nearest_int(inv_min*mins[j]);
            ls = MIN(63, ls);
            lm = MIN(63, lm);
            if (j < 4) {
                y[i].scales[j] = ls;
                y[i].scales[j+4] = lm;
            } else {
                y[i].scales[j+4] = (ls & 0xF) | ((lm & 0xF) << 4);
                y[i].scales[j-4] |= ((ls >> 4) << 6);
                y[i].scales[j-0] |= ((lm >> 4) << 6);
            }
        }
        y[i].d = GGML_FP32_TO_FP16(max_scale/63.f);
        y[i].dmin = GGML_FP32_TO_FP16(max_min/63.f);

        uint8_t sc, m;
        for (int j = 0; j < QK_K/32; ++j) {
            get_scale_min_k4(j, y[i].scales, &sc, &m);
            const float d = GGML_FP16_TO_FP32(y[i].d) * sc;
            if (!d) continue;
            const float dm = GGML_FP16_TO_FP32(y[i].dmin) * m;
            for (int ii = 0; ii < 32; ++ii) {
                int l = nearest_int((x[32*j + ii] + dm)/d);
                l = MAX(0, MIN(31, l));
                L[32*j + ii] = l;
            }
        }

        uint8_t * GGML_RESTRICT qh = y[i].qh;
        uint8_t * GGML_RESTRICT ql = y[i].qs;
        memset(qh, 0, QK_K/8);

        uint8_t m1 = 1, m2 = 2;
        for (int n = 0; n < QK_K; n += 64) {
            for (int j = 0; j < 32; ++j) {
                int l1 = L[n + j];
                if (l1 > 15) {
                    l1 -= 16; qh[j] |= m1;
                }
                int l2 = L[n + j + 32];
                if (l2 > 15) {
                    l2 -= 16; qh[j] |= m2;
                }
                ql[j] = l1 | (l2 << 4);
            }
            m1 <<= 2; m2 <<= 2;
            ql += 32;
        }

        x += QK_K;
    }
}

static void quantize_row_q6_K_ref(const float * GGML_RESTRICT x, block_q6_K * GGML_RESTRICT y, int64_t k) {
    const int64_t nb = k / QK_K;

    int8_t L[QK_K];
    float   scales[QK_K/16];

    for (int i = 0; i < nb; i++) {

        float max_scale = 0;
        float max_abs_scale = 0;

        for (int ib = 0; ib < QK_K/16; ++ib) {

            const float scale = make_qx_quants(16, 32, x + 16*ib, L + 16*ib, 1, NULL);
            scales[ib] = scale;

            const float abs_scale = fabsf(scale);
            if (abs_scale > max_abs_scale) {
                max_abs_scale = abs_scale;
                max_scale = scale;
            }

        }

        if (max_abs_scale < GROUP_MAX_EPS) {
            memset(&y[i], 0, sizeof(block_q6_K));
            y[i].d = GGML_FP32_TO_FP16(0.f);
            x += QK_K;
            continue;
        }

        float iscale = -128.f/max_scale;
        y[i].d = GGML_FP32_TO_FP16(1/iscale);
        for (int ib = 0; ib < QK_K/16; ++ib) {
            y[i].scales[ib] = MIN(127, nearest_int(iscale*scales[ib]));
        }

        for (int j = 0; j < QK_K/16; ++j) {
            float d = GGML_FP16_TO_FP32(y[i].d) * y[i].scales[j];
            if (!d) {
                continue;
            }
            for (int ii = 0; ii < 16; ++ii) {
                int l = nearest_int(x[16*j + ii]/d);
                l = MAX(-32, MIN(31, l));
                L[16*j + ii] = l + 32;
            }
        }

        uint8_t * GGML_RESTRICT ql = y[i].ql;
        uint8_t * GGML_RESTRICT qh = y[i].qh;
        for (int j = 0; j < QK_K; j += 128) {
            for (int l = 0; l < 32; ++l) {
                const uint8_t q1 = L[j + l +  0] & 0xF;
                const uint8_t q2 = L[j + l + 32] & 0xF;
                const uint8_t q3 = L[j + l + 64] & 0xF;
                const uint8_t q4 = L[j + l + 96] & 0xF;
                ql[l+ 0] = q1 | (q3 << 4);
                ql[l+32] = q2 | (q4 << 4);
                qh[l] = (L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6);
            }
            ql += 64;
            qh += 32;
        }

        x += QK_K;
    }
}


/* ============================================ Python ============================================ */

typedef struct {
    const char *name;
    int values, bytes;     /* per block */
    dequant_fn dequantize;
    void (*quantize)(const float *x, void *y, int64_t k);  /* NULL: not a K-quant encoder */
} kind_t;

#define ENCODER(f) ((void (*)(const float *, void *, int64_t))(f))

static const kind_t KINDS[] = {
    {"Q4_0", 32, 18, dq_q4_0, NULL},
    {"Q4_1", 32, 20, dq_q4_1, NULL},
    {"Q5_0", 32, 22, dq_q5_0, NULL},
    {"Q5_1", 32, 24, dq_q5_1, NULL},
    {"Q8_0", 32, 34, dq_q8_0, NULL},
    {"Q2_K", QK_K, 84, dq_q2_k, ENCODER(quantize_row_q2_K_ref)},
    {"Q3_K", QK_K, 110, dq_q3_k, ENCODER(quantize_row_q3_K_ref)},
    {"Q4_K", QK_K, 144, dq_q4_k, ENCODER(quantize_row_q4_K_ref)},
    {"Q5_K", QK_K, 176, dq_q5_k, ENCODER(quantize_row_q5_K_ref)},
    {"Q6_K", QK_K, 210, dq_q6_k, ENCODER(quantize_row_q6_K_ref)},
};

static const kind_t *find_kind(const char *name, int encoder) {
    for (size_t i = 0; i < sizeof(KINDS) / sizeof(KINDS[0]); i++) {
        if (strcmp(KINDS[i].name, name) == 0 && (!encoder || KINDS[i].quantize)) return &KINDS[i];
    }
    PyErr_Format(PyExc_ValueError, "_ggml: no %s for GGML type %s", encoder ? "encoder" : "dequantizer", name);
    return NULL;
}

static PyObject *py_dequantize(PyObject *self, PyObject *args) {
    const char *name;
    Py_buffer src, dst;
    if (!PyArg_ParseTuple(args, "sy*w*", &name, &src, &dst)) return NULL;
    PyObject *result = NULL;
    const kind_t *kind = find_kind(name, 0);
    if (kind == NULL) goto done;
    Py_ssize_t n = src.len / kind->bytes;
    if (src.len % kind->bytes || dst.len != n * kind->values * (Py_ssize_t)sizeof(float)) {
        PyErr_Format(PyExc_ValueError, "%zd bytes of %s blocks do not fill %zd float32 bytes", src.len, name,
                     dst.len);
        goto done;
    }
    if ((uintptr_t)dst.buf % sizeof(float)) {
        PyErr_SetString(PyExc_ValueError, "_ggml.dequantize: the float32 output is not 4-byte aligned");
        goto done;
    }
    Py_ssize_t bad;
    Py_BEGIN_ALLOW_THREADS
    bad = kind->dequantize((const uint8_t *)src.buf, (float *)dst.buf, n);
    Py_END_ALLOW_THREADS
    result = PyLong_FromSsize_t(bad);
done:
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return result;
}

#define ROWS_PER_CALL 4096  /* super-blocks per call of a quantize_row_*_ref (whose counts are ints) */

static PyObject *py_quantize(PyObject *self, PyObject *args) {
    const char *name;
    Py_buffer src, dst;
    if (!PyArg_ParseTuple(args, "sy*w*", &name, &src, &dst)) return NULL;
    PyObject *result = NULL;
    const kind_t *kind = find_kind(name, 1);
    if (kind == NULL) goto done;
    const Py_ssize_t block_floats = QK_K * (Py_ssize_t)sizeof(float);
    Py_ssize_t n = src.len / block_floats;
    if (src.len % block_floats || dst.len != n * kind->bytes) {
        PyErr_Format(PyExc_ValueError, "%zd float32 bytes are not whole %d-value blocks filling %zd bytes of %s",
                     src.len, QK_K, dst.len, name);
        goto done;
    }
    if ((uintptr_t)src.buf % sizeof(float)) {
        PyErr_SetString(PyExc_ValueError, "_ggml.quantize: the float32 input is not 4-byte aligned");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i += ROWS_PER_CALL) {
        const Py_ssize_t m = n - i < ROWS_PER_CALL ? n - i : ROWS_PER_CALL;
        kind->quantize((const float *)src.buf + i * QK_K, (uint8_t *)dst.buf + i * kind->bytes, m * QK_K);
    }
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return result;
}

static PyMethodDef methods[] = {
    {"dequantize", py_dequantize, METH_VARARGS,
     "dequantize(kind, blocks, out) -> int: whole blocks of GGML type `kind` (bytes-like) into `out`, a "
     "writable float32 buffer of as many values, as gguf.quants.dequantize computes them; returns how many "
     "blocks hold an Inf or NaN float16 field, whose values are left for gguf's own code."},
    {"quantize", py_quantize, METH_VARARGS,
     "quantize(kind, values, out): float32 values (whole 256-value blocks) into `out`, the bytes of K-quant "
     "`kind` (Q2_K..Q6_K), as llama.cpp's quantize_row_*_ref writes them."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_ggml", "lmconvert's C kernels for GGML blocks.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__ggml(void) { return PyModule_Create(&module); }
