// Matmul and row lookup straight from GGUF's quantized blocks: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (32
// weights a block) and the K-quants Q4_K, Q5_K, Q6_K (256 weights a block: the types inside
// Q4_K_M / Q5_K_M / Q6_K files).
//
// Why by hand: PyTorch has no CPU kernel that reads ggml block formats, and its
// own weight-only int8/int4 CPU kernels (_weight_int8pack_mm,
// _weight_int4pack_mm_for_cpu) ran slower than fp32 linear on AVX2 machines in
// this project's measurements. Decode at small batch is a weight-streaming
// problem, so reading 4.5-6.6 bits per weight instead of 32 is the whole game.
//
// Numerics: every block is dequantized to the exact fp32 values the checkpoint
// encodes (gguf's reference dequantization, bit for bit) and multiplied with fp32
// activations, accumulating in fp32. Only the summation order differs from
// dequantize-then-fp32-matmul.
//
// Layout: a weight is a uint8 tensor (N, row_bytes), one output row per row,
// the row being K/32 (K/256 for K-quants) consecutive ggml blocks, exactly as stored in the file.
// Every kernel walks a row in groups of 32 weights: a 32-weight block is one group, a K-quant
// block is eight, each with its own scale (two for Q6_K, one per 16 weights) and minimum. So the
// accumulation order, the register tiles and the batch invariance are the same for every type.

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define FM_AVX2 1
#else
#define FM_AVX2 0
#endif
// AVX-512 (built only where the CPU has it; fastmode.kernels.compile_flags): the fp32 path runs
// 16-wide. The int8 path and the scalar reference are the same on both.
#if FM_AVX2 && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
#define FM_AVX512 1
#else
#define FM_AVX512 0
#endif

// packed_int8.cpp: int8 activations against weights repacked eight rows at a time.
torch::Tensor packed_matmul(torch::Tensor x, torch::Tensor p, int64_t qtype);
constexpr int64_t kPacked = 100;  // added to a ggml type id: "this weight is packed" (fastmode.models.quant_linear)

// amx_matmul.cpp: the fp32-activation path on AMX tiles, where built and granted.
bool amx_matmul(const float* xp, int64_t M, int64_t K, const uint8_t* wp, int64_t N, int64_t row_bytes, int64_t qtype,
                float* op);

namespace {

constexpr int kBlock = 32;
// Up to this many activation rows the blocks are read directly (one group of rows); more go
// through a dequantized buffer, or AMX tiles where built and granted.
constexpr int64_t kDirectMaxRows = 8;
constexpr int64_t kMaxBlocks = 1024;  // 32-weight groups a row may hold: rows of up to 32768 features
// ggml type ids
constexpr int64_t kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14;

constexpr bool is_kquant(int64_t qt) { return qt == kQ4_K || qt == kQ5_K || qt == kQ6_K; }
// The types whose 32-weight block needs no 5th/6th bit or sub-block scales: their own dequantizers below.
constexpr bool is_simple(int64_t qt) { return qt == kQ4_0 || qt == kQ4_1 || qt == kQ8_0; }

// Bytes of one stored block (-1: not a type the kernels read).
constexpr int64_t block_bytes_of(int64_t qt) {
  return qt == kQ4_0   ? 2 + 16             // fp16 d, 32 nibbles
         : qt == kQ4_1 ? 4 + 16             // fp16 d and m, 32 nibbles
         : qt == kQ5_0 ? 2 + 4 + 16         // fp16 d, 32 fifth bits, 32 nibbles
         : qt == kQ5_1 ? 4 + 4 + 16         // fp16 d and m, 32 fifth bits, 32 nibbles
         : qt == kQ8_0 ? 2 + 32             // fp16 d, 32 int8
         : qt == kQ4_K ? 4 + 12 + 128       // fp16 d and dmin, 8 x 6-bit scale and min, 256 nibbles
         : qt == kQ5_K ? 4 + 12 + 32 + 128  // as Q4_K, plus 256 fifth bits
         : qt == kQ6_K ? 128 + 64 + 16 + 2  // 256 low nibbles, 256 x 2 high bits, 16 int8 scales, fp16 d
                       : -1;
}
// Weights one stored block holds.
constexpr int64_t block_weights_of(int64_t qt) { return is_kquant(qt) ? 256 : 32; }

int64_t block_bytes(int64_t qtype) {
  TORCH_CHECK(block_bytes_of(qtype) > 0, "fastmode kernels: unsupported ggml type ", qtype,
              " (supported: Q4_0=2, Q4_1=3, Q5_0=6, Q5_1=7, Q8_0=8, Q4_K=12, Q5_K=13, Q6_K=14)");
  return block_bytes_of(qtype);
}

// Runs f(std::integral_constant<int, QT>) for the type id `qtype`: one template instance per type.
template <class F>
void with_qtype(int64_t qtype, F&& f) {
  switch (qtype) {
    case kQ4_0: f(std::integral_constant<int, kQ4_0>()); return;
    case kQ4_1: f(std::integral_constant<int, kQ4_1>()); return;
    case kQ5_0: f(std::integral_constant<int, kQ5_0>()); return;
    case kQ5_1: f(std::integral_constant<int, kQ5_1>()); return;
    case kQ8_0: f(std::integral_constant<int, kQ8_0>()); return;
    case kQ4_K: f(std::integral_constant<int, kQ4_K>()); return;
    case kQ5_K: f(std::integral_constant<int, kQ5_K>()); return;
    case kQ6_K: f(std::integral_constant<int, kQ6_K>()); return;
  }
  block_bytes(qtype);  // throws, naming the supported types
}

inline float half_to_float(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
#if FM_AVX2
  return _cvtsh_ss(bits);  // one F16C instruction; the same (exact) value
#else
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
#endif
}

// Scalar dequantization of one block into out[0..31]; the reference the SIMD path must match.
inline void dequant_block_scalar(int64_t qtype, const uint8_t* b, float* out) {
  const float d = half_to_float(b);
  if (qtype == kQ8_0) {
    const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
    for (int j = 0; j < 32; ++j) out[j] = d * qs[j];
    return;
  }
  const float m = qtype == kQ4_1 ? half_to_float(b + 2) : -8.0f * d;
  const uint8_t* qs = b + (qtype == kQ4_1 ? 4 : 2);
  for (int j = 0; j < 16; ++j) {
    out[j] = d * (qs[j] & 0x0F) + m;
    out[j + 16] = d * (qs[j] >> 4) + m;
  }
}

// A 32-weight group of the 5- and 6-bit types and the K-quants, as unsigned integers u_j (0..63)
// in weight order and per half (weights 0-15, 16-31) a scale d, an integer offset o and an additive
// term mk: weight j = d (u_j - o) + mk. That form reproduces gguf's arithmetic exactly: d (u - o) is
// exact in fp32 for every type (at most 11 + 7 + 5 significant bits), so each weight is rounded
// once, where gguf rounds it (Q5_1: d q + m; K-quants: (d sc) q - dmin mn; Q5_0, Q6_K: d (q - o)).
struct GroupScales {
  float d[2], mk[2];
  int o;
};

// The 6-bit scale and minimum of group s (0-7) of a Q4_K / Q5_K block, from its 12 packed bytes:
// groups 0-3 keep theirs in the low 6 bits of bytes s and s + 4; groups 4-7 in the nibbles of byte
// s + 4, with the top two bits in the spare bits of bytes s - 4 and s.
inline void kquant_scale_min(const uint8_t* sc, int s, int& scale, int& min) {
  if (s < 4) {
    scale = sc[s] & 63;
    min = sc[s + 4] & 63;
  } else {
    scale = (sc[s + 4] & 0x0F) | ((sc[s - 4] >> 6) << 4);
    min = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
  }
}

// Scales of group s of block b (not the simple types).
template <int QT>
inline GroupScales group_scales(const uint8_t* b, int s) {
  GroupScales g{};
  if constexpr (QT == kQ5_0 || QT == kQ5_1) {
    const float d = half_to_float(b);
    g.d[0] = g.d[1] = d;
    g.mk[0] = g.mk[1] = QT == kQ5_1 ? half_to_float(b + 2) : 0.0f;
    g.o = QT == kQ5_1 ? 0 : 16;
  } else if constexpr (QT == kQ4_K || QT == kQ5_K) {
    int sc, mn;
    kquant_scale_min(b + 4, s, sc, mn);
    g.d[0] = g.d[1] = half_to_float(b) * static_cast<float>(sc);  // exact: 11 x 6 bits
    g.mk[0] = g.mk[1] = -(half_to_float(b + 2) * static_cast<float>(mn));
    g.o = 0;
  } else {  // Q6_K: one int8 scale per 16 weights
    const float d = half_to_float(b + 208);
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    g.d[0] = d * static_cast<float>(sc[2 * s]);
    g.d[1] = d * static_cast<float>(sc[2 * s + 1]);
    g.mk[0] = g.mk[1] = 0.0f;
    g.o = 32;
  }
  return g;
}

// The integers u_j of group s of block b, one at a time (the reference for the SIMD unpacking).
//   Q5_0/Q5_1: byte j of the 16 holds weights j (low nibble) and j + 16 (high); bit j of the 32-bit
//     word before them is weight j's fifth bit.
//   Q4_K/Q5_K: 32 bytes per two groups: group 2c takes the low nibbles of bytes 32c..32c+31, group
//     2c+1 the high ones; Q5_K's fifth bit of weight j of group s is bit s of byte j of its 32.
//   Q6_K: two halves of 128 weights; in half h, group t (0-3) takes nibble t / 2 of bytes
//     64h + 32 (t % 2) + j and bits 2t, 2t+1 of byte 128 + 32h + j as its high bits.
template <int QT>
inline void group_u8_scalar(const uint8_t* b, int s, uint8_t* u) {
  if constexpr (QT == kQ5_0 || QT == kQ5_1) {
    uint32_t qh;
    std::memcpy(&qh, b + (QT == kQ5_1 ? 4 : 2), 4);
    const uint8_t* qs = b + (QT == kQ5_1 ? 8 : 6);
    for (int j = 0; j < 16; ++j) {
      u[j] = (qs[j] & 0x0F) | (((qh >> j) & 1) << 4);
      u[j + 16] = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
    }
  } else if constexpr (QT == kQ4_K || QT == kQ5_K) {
    const uint8_t* qs = b + (QT == kQ5_K ? 48 : 16) + 32 * (s / 2);
    const int shift = 4 * (s & 1);
    for (int j = 0; j < 32; ++j) {
      u[j] = (qs[j] >> shift) & 0x0F;
      if constexpr (QT == kQ5_K) u[j] |= ((b[16 + j] >> s) & 1) << 4;
    }
  } else {
    const int h = s / 4, t = s % 4;
    const uint8_t* ql = b + 64 * h + 32 * (t & 1);
    const uint8_t* qh = b + 128 + 32 * h;
    for (int j = 0; j < 32; ++j) u[j] = ((ql[j] >> (4 * (t >> 1))) & 0x0F) | (((qh[j] >> (2 * t)) & 3) << 4);
  }
}

// Stored block that holds 32-weight group g of a row, and the group's index within it.
template <int QT>
inline const uint8_t* group_block(const uint8_t* row, int64_t g, int& s) {
  constexpr int64_t G = block_weights_of(QT) / kBlock;
  s = static_cast<int>(g % G);
  return row + (g / G) * block_bytes_of(QT);
}

// Group g of a row -> out[0..31], exactly gguf's values.
template <int QT>
inline void dequant_group_scalar(const uint8_t* row, int64_t g, float* out) {
  int s;
  const uint8_t* b = group_block<QT>(row, g, s);
  if constexpr (is_simple(QT)) {
    dequant_block_scalar(QT, b, out);
  } else {
    uint8_t u[kBlock];
    group_u8_scalar<QT>(b, s, u);
    const GroupScales sc = group_scales<QT>(b, s);
    for (int j = 0; j < kBlock; ++j)
      out[j] = sc.d[j / 16] * static_cast<float>(static_cast<int>(u[j]) - sc.o) + sc.mk[j / 16];
  }
}

#if FM_AVX2
// The block's fp16 scale (and, for Q4_1, its fp16 minimum right after it) as floats in lanes 0
// (and 1): one conversion for both.
inline __m128 block_scales(const uint8_t* b, bool with_min) {
  int32_t bits = 0;
  std::memcpy(&bits, b, with_min ? 4 : 2);
  return _mm_cvtph_ps(_mm_cvtsi32_si128(bits));
}

// One block -> four vectors holding weights 0-7, 8-15, 16-23, 24-31. Nibbles are widened
// byte -> 32-bit lane straight from memory and split there (byte j holds weights j and j + 16),
// which takes fewer shuffles than splitting the 16 bytes first; at one activation row this
// dequantization is most of a matmul's instructions.
inline void dequant_block_avx2(int64_t qtype, const uint8_t* b, __m256& w0, __m256& w1, __m256& w2, __m256& w3) {
  const __m128 dm = block_scales(b, qtype == kQ4_1);
  const __m256 d = _mm256_broadcastss_ps(dm);
  if (qtype == kQ8_0) {
    const uint8_t* qs = b + 2;
    w0 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs)))));
    w1 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + 8)))));
    w2 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + 16)))));
    w3 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + 24)))));
    return;
  }
  const __m256 m = qtype == kQ4_1 ? _mm256_broadcastss_ps(_mm_movehdup_ps(dm)) : _mm256_mul_ps(d, _mm256_set1_ps(-8.0f));
  const uint8_t* qs = b + (qtype == kQ4_1 ? 4 : 2);
  const __m256i mask = _mm256_set1_epi32(0x0F);
  const __m256i lo8 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs)));      // bytes 0-7
  const __m256i hi8 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + 8)));  // bytes 8-15
  w0 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_and_si256(lo8, mask)), m);
  w1 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_and_si256(hi8, mask)), m);
  w2 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_srli_epi32(lo8, 4)), m);
  w3 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_srli_epi32(hi8, 4)), m);
}

// group_u8_scalar in one register: 32 bytes u_j in weight order.
template <int QT>
inline __m256i group_u8_avx2(const uint8_t* b, int s) {
  if constexpr (QT == kQ5_0 || QT == kQ5_1) {
    uint32_t qh;
    std::memcpy(&qh, b + (QT == kQ5_1 ? 4 : 2), 4);
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + (QT == kQ5_1 ? 8 : 6)));
    const __m128i nib = _mm_set1_epi8(0x0F);
    const __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), nib), _mm_and_si128(v, nib));
    // Bit j of qh -> 0x10 in byte j: byte j takes qh's byte j / 8 and tests bit j % 8.
    const __m256i sel = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  //
                                         2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
    const __m256i hb = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)), sel);
    const __m256i h = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, bit), bit), _mm256_set1_epi8(0x10));
    return _mm256_or_si256(q, h);
  } else if constexpr (QT == kQ4_K || QT == kQ5_K) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + (QT == kQ5_K ? 48 : 16) + 32 * (s / 2)));
    __m256i q = _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(4 * (s & 1))), _mm256_set1_epi8(0x0F));
    if constexpr (QT == kQ5_K) {  // 16-bit shifts: the mask keeps each byte's own bit s
      const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
      const __m256i h = _mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(s)), _mm256_set1_epi8(1));
      q = _mm256_or_si256(q, _mm256_slli_epi16(h, 4));
    }
    return q;
  } else {
    const int h = s / 4, t = s % 4;
    const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32 * (t & 1)));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
    const __m256i lo = _mm256_and_si256(_mm256_srl_epi16(ql, _mm_cvtsi32_si128(4 * (t >> 1))), _mm256_set1_epi8(0x0F));
    const __m256i hi = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * t)), _mm256_set1_epi8(3));
    return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
  }
}

// Group g of a row -> four vectors holding weights 0-7, 8-15, 16-23, 24-31, exactly gguf's values:
// FMA(d, u, mk - o d) rounds d (u - o) + mk once, as the scalar form does (o d is exact).
template <int QT>
inline void dequant_group_avx2(const uint8_t* row, int64_t g, __m256* w) {
  int s;
  const uint8_t* b = group_block<QT>(row, g, s);
  if constexpr (is_simple(QT)) {
    dequant_block_avx2(QT, b, w[0], w[1], w[2], w[3]);
  } else {
    const __m256i u = group_u8_avx2<QT>(b, s);
    const GroupScales sc = group_scales<QT>(b, s);
    const __m128i lo = _mm256_castsi256_si128(u), hi = _mm256_extracti128_si256(u, 1);
    const __m128i part[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int i = 0; i < 4; ++i) {
      const float d = sc.d[i / 2], m = sc.mk[i / 2] - static_cast<float>(sc.o) * d;
      w[i] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(part[i])), _mm256_set1_ps(m));
    }
  }
}

// A whole K-quant block (256 weights) group by group: f(s, v) gets group s's four vectors, the same
// values dequant_group_avx2 gives. The scales and minimums are unpacked once per block, and the
// packed bytes two groups share (Q4_K/Q5_K: one 32-byte run holds groups 2c and 2c+1 in its low and
// high nibbles) are widened once; each 8-weight vector is widened from memory and split in 32-bit
// lanes, as the Q4 blocks are. At one activation row this is most of a matmul's work.
template <int QT, class F>
inline void kquant_block_avx2(const uint8_t* b, F&& f) {
  alignas(32) float d[16], m[16];  // per half-group (16 weights): weight = FMA(d, u, m)
  if constexpr (QT == kQ6_K) {
    const __m256 dd = _mm256_set1_ps(half_to_float(b + 208));
    for (int i = 0; i < 2; ++i) {  // as group_scales: d sc, then 0 - 32 (d sc)
      const __m256 di = _mm256_mul_ps(dd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                              _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 192 + 8 * i)))));
      _mm256_store_ps(d + 8 * i, di);
      _mm256_store_ps(m + 8 * i, _mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(_mm256_set1_ps(32.0f), di)));
    }
  } else {
    const float dd = half_to_float(b), dmin = half_to_float(b + 2);
    for (int s = 0; s < 8; ++s) {
      int sc, mn;
      kquant_scale_min(b + 4, s, sc, mn);
      const float ds = dd * static_cast<float>(sc), mk = -(dmin * static_cast<float>(mn));
      d[2 * s] = d[2 * s + 1] = ds;
      m[2 * s] = m[2 * s + 1] = mk - 0.0f * ds;
    }
  }
  auto widen = [](const uint8_t* p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); };
  const __m256i nib = _mm256_set1_epi32(0x0F);
  __m256 v[4];
  if constexpr (QT == kQ6_K) {
    const __m256i three = _mm256_set1_epi32(3);
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = b + 64 * h;
      const uint8_t* qh = b + 128 + 32 * h;
      for (int t = 0; t < 4; ++t) {
        const int s = 4 * h + t;
        const __m128i lo_shift = _mm_cvtsi32_si128(4 * (t >> 1)), hi_shift = _mm_cvtsi32_si128(2 * t);
        for (int i = 0; i < 4; ++i) {
          const __m256i lo = _mm256_and_si256(_mm256_srl_epi32(widen(ql + 32 * (t & 1) + 8 * i), lo_shift), nib);
          const __m256i hi = _mm256_and_si256(_mm256_srl_epi32(widen(qh + 8 * i), hi_shift), three);
          const __m256i u = _mm256_or_si256(lo, _mm256_slli_epi32(hi, 4));
          const int k = 2 * s + i / 2;
          v[i] = _mm256_fmadd_ps(_mm256_set1_ps(d[k]), _mm256_cvtepi32_ps(u), _mm256_set1_ps(m[k]));
        }
        f(s, v);
      }
    }
  } else {
    const uint8_t* qs = b + (QT == kQ5_K ? 48 : 16);
    for (int c = 0; c < 4; ++c) {
      __m256i z[4];
      for (int i = 0; i < 4; ++i) z[i] = widen(qs + 32 * c + 8 * i);
      for (int half = 0; half < 2; ++half) {
        const int s = 2 * c + half;
        const __m256 ds = _mm256_set1_ps(d[2 * s]), ms = _mm256_set1_ps(m[2 * s]);
        for (int i = 0; i < 4; ++i) {
          __m256i u = half ? _mm256_srli_epi32(z[i], 4) : _mm256_and_si256(z[i], nib);
          if constexpr (QT == kQ5_K) {
            const __m256i hb = _mm256_srl_epi32(widen(b + 16 + 8 * i), _mm_cvtsi32_si128(s));
            u = _mm256_or_si256(u, _mm256_slli_epi32(_mm256_and_si256(hb, _mm256_set1_epi32(1)), 4));
          }
          v[i] = _mm256_fmadd_ps(ds, _mm256_cvtepi32_ps(u), ms);
        }
        f(s, v);
      }
    }
  }
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The fp32 path is written once over a vector of kLanes floats: 8 on AVX2, 16 on AVX-512.
// Per block, weight j of the block lands in vector j / kLanes, lane j % kLanes, and each
// output's accumulator takes the block's vectors in order: the order is fixed per build,
// whichever path (direct or buffered) a row takes.
#if FM_AVX512
using vfloat = __m512;
constexpr int kLanes = 16;
inline vfloat vzero() { return _mm512_setzero_ps(); }
inline vfloat vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, vfloat v) { _mm512_storeu_ps(p, v); }
inline vfloat vfma(vfloat a, vfloat b, vfloat c) { return _mm512_fmadd_ps(a, b, c); }
inline float vsum(vfloat v) {  // fixed order: halves, then the 8-wide hsum
  return hsum(_mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
}

// One block -> two vectors holding weights 0-15 and 16-31. The block's fp16 scale and minimum
// are read as one 32-bit pair broadcast to every lane and converted at once (lanes d, m, d, m,
// ...; duplicating even or odd lanes gives d or m everywhere). A Q4 block has 16 possible
// values, d k + m for k = 0..15: one FMA makes that table, and a permute per vector looks each
// weight up by its nibble (vpermps reads only an index's low 4 bits, so the low nibble needs
// no mask). The 16 bytes of nibbles are widened to 32-bit lanes in one instruction (byte j
// holds weights j and j + 16). The values are exactly FMA(d, q, m), as on AVX2. At one
// activation row this dequantization is most of a matmul's work; the sequence was chosen by
// A/B builds against converting the scales in an xmm register and broadcasting them, with a
// mask + convert + FMA per vector (the AVX2 code gained nothing from the same change and
// keeps its form).
inline void dequant_block_v(int64_t qtype, const uint8_t* b, vfloat* w) {
  int32_t pair;  // Q4_0 and Q8_0 have no minimum: their odd lanes hold quant bytes, unused
  std::memcpy(&pair, b, 4);
  const __m512 dm = _mm512_cvtph_ps(_mm256_set1_epi32(pair));
  const __m512 d = _mm512_moveldup_ps(dm);
  if (qtype == kQ8_0) {
    const uint8_t* qs = b + 2;
    w[0] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)))));
    w[1] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + 16)))));
    return;
  }
  const __m512 m = qtype == kQ4_1 ? _mm512_movehdup_ps(dm) : _mm512_mul_ps(d, _mm512_set1_ps(-8.0f));
  const uint8_t* qs = b + (qtype == kQ4_1 ? 4 : 2);
  const __m512 table = _mm512_fmadd_ps(d, _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), m);
  const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  w[0] = _mm512_permutexvar_ps(q, table);
  w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), table);
}
#else
using vfloat = __m256;
constexpr int kLanes = 8;
inline vfloat vzero() { return _mm256_setzero_ps(); }
inline vfloat vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, vfloat v) { _mm256_storeu_ps(p, v); }
inline vfloat vfma(vfloat a, vfloat b, vfloat c) { return _mm256_fmadd_ps(a, b, c); }
inline float vsum(vfloat v) { return hsum(v); }
#endif
constexpr int kPerBlock = 32 / kLanes;  // vectors per block

// Group g of a row (a whole block for the 32-weight types) -> kPerBlock vectors.
template <int QT>
inline void dequant_group_v(const uint8_t* row, int64_t g, vfloat* w) {
#if FM_AVX512
  if constexpr (is_simple(QT)) {
    dequant_block_v(QT, row + g * block_bytes_of(QT), w);
  } else {  // unpacked 8 wide, joined into two 16-wide vectors
    __m256 v[4];
    dequant_group_avx2<QT>(row, g, v);
    w[0] = _mm512_insertf32x8(_mm512_castps256_ps512(v[0]), v[1], 1);
    w[1] = _mm512_insertf32x8(_mm512_castps256_ps512(v[2]), v[3], 1);
  }
#else
  dequant_group_avx2<QT>(row, g, w);
#endif
}
#endif


// ---- fp32 activations (the default) ----------------------------------------
// Each task dequantizes a chunk of weight rows to the exact fp32 values the
// file encodes (d q + m) into a buffer that stays in cache, then multiplies it
// with the fp32 activations in register tiles of NR weight rows x MR
// activation rows. Every output keeps one 8-wide accumulator that runs over K
// in order and is reduced by hsum, whatever the tile shape: a row's result
// does not depend on the batch it was computed in (speculative verification
// stays exact). A dequantized block is reused by every row of the batch, so
// the cost per row falls with the batch instead of staying at one dequant per
// block and row.

#if FM_AVX2
template <int QT>
inline void dequant_rows(const uint8_t* wp, int64_t row_bytes, int64_t n0, int64_t n1, int64_t K, float* buf) {
  const int64_t nb = K / kBlock;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* wrow = wp + n * row_bytes;
    float* o = buf + (n - n0) * K;
    for (int64_t b = 0; b < nb; ++b, o += kBlock) {
      vfloat w[kPerBlock];
      dequant_group_v<QT>(wrow, b, w);
      for (int j = 0; j < kPerBlock; ++j) vstore(o + j * kLanes, w[j]);
    }
  }
}

// Register tiles: the vector registers there are (16 ymm, 32 zmm) bound how many weight rows
// (NR) a tile of MR activation rows can hold accumulators for.
constexpr int kRegs = kLanes == 16 ? 32 : 16;

// out[m * ldo + n] = dot(w row n, x row m) for n < NR, m < MR; w rows are K apart.
// Register use: NR x MR accumulators plus whichever operand is held (the
// smaller of NR and MR vectors), at most kRegs vector registers for the shapes used.
template <int NR, int MR>
inline void tile_f32(const float* w, const float* x, int64_t K, int64_t ldx, float* out, int64_t ldo) {
  vfloat acc[NR][MR];
  for (int n = 0; n < NR; ++n)
    for (int m = 0; m < MR; ++m) acc[n][m] = vzero();
  for (int64_t k = 0; k < K; k += kLanes) {
    if constexpr (MR <= NR) {
      vfloat xv[MR];
      for (int m = 0; m < MR; ++m) xv[m] = vload(x + m * ldx + k);
      for (int n = 0; n < NR; ++n) {
        const vfloat wv = vload(w + n * K + k);
        for (int m = 0; m < MR; ++m) acc[n][m] = vfma(wv, xv[m], acc[n][m]);
      }
    } else {
      vfloat wv[NR];
      for (int n = 0; n < NR; ++n) wv[n] = vload(w + n * K + k);
      for (int m = 0; m < MR; ++m) {
        const vfloat xv = vload(x + m * ldx + k);
        for (int n = 0; n < NR; ++n) acc[n][m] = vfma(wv[n], xv, acc[n][m]);
      }
    }
  }
  for (int n = 0; n < NR; ++n)
    for (int m = 0; m < MR; ++m) out[m * ldo + n] = vsum(acc[n][m]);
}

// Weight rows [0, nrows) of buf against MR activation rows: tiles as wide as
// the registers allow for this MR, single rows for the remainder.
template <int MR>
inline void sweep_rows(const float* buf, int64_t nrows, const float* x, int64_t K, int64_t ldx, float* out,
                       int64_t ldo) {
  constexpr int NR = kRegs == 32 ? (MR <= 2 ? 8 : 6) : (MR == 1 ? 8 : MR == 2 ? 6 : MR == 3 ? 4 : 3);
  int64_t n = 0;
  for (; n + NR <= nrows; n += NR) tile_f32<NR, MR>(buf + n * K, x, K, ldx, out + n, ldo);
  for (; n < nrows; ++n) tile_f32<1, MR>(buf + n * K, x, K, ldx, out + n, ldo);
}

// MR activation rows against NR weight rows, dequantizing each block in
// registers: for a few rows there is too little reuse to pay for writing the
// dequantized chunk to a buffer and reading it back. Same accumulation as
// tile_f32 (one accumulator per output, k in order), so results are
// bit-identical whichever path a row takes.
template <int QT, int NR, int MR>
inline void rows_direct_f32(const uint8_t* w, int64_t row_bytes, int64_t nb, const float* x, int64_t ldx, float* out,
                            int64_t ldo) {
  // Bytes of a row per 32-weight group, for the prefetch distance below.
  constexpr int64_t BB = block_bytes_of(QT) * kBlock / block_weights_of(QT);
  // NR row streams outrun the hardware prefetcher: ask for each row's data this far ahead. The
  // fewer rows, the less compute per byte hides memory latency, so the further ahead (chosen
  // by A/B builds on the project's VM; benchmarks/kernels.py times the result, not the choice).
  constexpr int64_t kAhead = MR == 1 ? 2048 : MR == 2 ? 1024 : 256;
  vfloat acc[NR][MR];
  for (int n = 0; n < NR; ++n)
    for (int m = 0; m < MR; ++m) acc[n][m] = vzero();
  if constexpr (is_kquant(QT)) {
    // A K-quant block at a time per row (its scales unpacked once): each accumulator still takes
    // the row's groups in order, so the sums are those of the group-at-a-time form below.
    constexpr int64_t SB = block_bytes_of(QT), G = block_weights_of(QT) / kBlock;
    for (int64_t sb = 0; sb < nb / G; ++sb) {
      for (int n = 0; n < NR; ++n) {
        const uint8_t* blk = w + n * row_bytes + sb * SB;
        for (int64_t off = 0; off < SB; off += 64)
          _mm_prefetch(reinterpret_cast<const char*>(blk + off + kAhead), _MM_HINT_T0);
        kquant_block_avx2<QT>(blk, [&](int s, const __m256* v) {
          vfloat wv[kPerBlock];
#if FM_AVX512
          wv[0] = _mm512_insertf32x8(_mm512_castps256_ps512(v[0]), v[1], 1);
          wv[1] = _mm512_insertf32x8(_mm512_castps256_ps512(v[2]), v[3], 1);
#else
          for (int j = 0; j < kPerBlock; ++j) wv[j] = v[j];
#endif
          for (int m = 0; m < MR; ++m) {
            const float* xb = x + m * ldx + (sb * G + s) * kBlock;
            for (int j = 0; j < kPerBlock; ++j) acc[n][m] = vfma(wv[j], vload(xb + j * kLanes), acc[n][m]);
          }
        });
      }
    }
    for (int n = 0; n < NR; ++n)
      for (int m = 0; m < MR; ++m) out[m * ldo + n] = vsum(acc[n][m]);
    return;
  }
  for (int64_t b = 0; b < nb; ++b) {
    for (int n = 0; n < NR; ++n) {
      _mm_prefetch(reinterpret_cast<const char*>(w + n * row_bytes + b * BB + kAhead), _MM_HINT_T0);
      vfloat wv[kPerBlock];
      dequant_group_v<QT>(w + n * row_bytes, b, wv);
      for (int m = 0; m < MR; ++m) {
        const float* xb = x + m * ldx + b * kBlock;
        for (int j = 0; j < kPerBlock; ++j) acc[n][m] = vfma(wv[j], vload(xb + j * kLanes), acc[n][m]);
      }
    }
  }
  for (int n = 0; n < NR; ++n)
    for (int m = 0; m < MR; ++m) out[m * ldo + n] = vsum(acc[n][m]);
}

// Weight rows [n0, n1) against MR activation rows, directly from the blocks.
template <int QT, int MR>
inline void sweep_direct(const uint8_t* wp, int64_t row_bytes, int64_t n0, int64_t n1, int64_t nb, const float* x,
                         int64_t ldx, float* out, int64_t ldo) {
  // Weight rows in flight: each output's accumulator is one chain of kPerBlock FMAs per block,
  // so one activation row needs several rows in flight to keep the FMA units busy (on AVX2,
  // chosen by A/B builds: three, four were no better, two slower); more rows bring their own
  // chains. AVX-512 has twice the registers and half the chain per block.
  constexpr int NR = kRegs == 32 ? (MR == 1 ? 4 : MR <= 4 ? 3 : 2) : (MR == 1 ? 3 : MR <= 4 ? 2 : 1);
  int64_t n = n0;
  for (; n + NR <= n1; n += NR) rows_direct_f32<QT, NR, MR>(wp + n * row_bytes, row_bytes, nb, x, ldx, out + n, ldo);
  for (; n < n1; ++n) rows_direct_f32<QT, 1, MR>(wp + n * row_bytes, row_bytes, nb, x, ldx, out + n, ldo);
}

template <int QT>
void matmul_f32(const float* xp, int64_t M, int64_t K, const uint8_t* wp, int64_t N, int64_t row_bytes, float* op) {
  if (M <= kDirectMaxRows) {  // decode at small batch, verifications: stream the weights once, no buffer
    const int64_t nb = K / kBlock;
    at::parallel_for(0, (N + 11) / 12, 3, [&](int64_t t0, int64_t t1) {
      const int64_t n0 = t0 * 12, n1 = std::min(N, t1 * 12);
      switch (M) {
        case 8: sweep_direct<QT, 8>(wp, row_bytes, n0, n1, nb, xp, K, op, N); break;
        case 7: sweep_direct<QT, 7>(wp, row_bytes, n0, n1, nb, xp, K, op, N); break;
        case 6: sweep_direct<QT, 6>(wp, row_bytes, n0, n1, nb, xp, K, op, N); break;
        case 5: sweep_direct<QT, 5>(wp, row_bytes, n0, n1, nb, xp, K, op, N); break;
        case 4: sweep_direct<QT, 4>(wp, row_bytes, n0, n1, nb, xp, K, op, N); break;
        case 3: sweep_direct<QT, 3>(wp, row_bytes, n0, n1, nb, xp, K, op, N); break;
        case 2: sweep_direct<QT, 2>(wp, row_bytes, n0, n1, nb, xp, K, op, N); break;
        default: sweep_direct<QT, 1>(wp, row_bytes, n0, n1, nb, xp, K, op, N); break;
      }
    });
    return;
  }
  constexpr int64_t kChunk = 24;  // weight rows per task: a multiple of every tile width (8, 6, 4, 3)
  at::parallel_for(0, (N + kChunk - 1) / kChunk, 1, [&](int64_t c0, int64_t c1) {
    std::vector<float> buf(kChunk * K);  // the chunk, dequantized: at most 147 KB, L2-resident
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t n0 = c * kChunk, nrows = std::min(N, n0 + kChunk) - n0;
      dequant_rows<QT>(wp, row_bytes, n0, n0 + nrows, K, buf.data());
      // Four activation rows at a time stay in L1 while the chunk streams past them.
      int64_t m = 0;
      for (; m + 4 <= M; m += 4) sweep_rows<4>(buf.data(), nrows, xp + m * K, K, K, op + m * N + n0, N);
      switch (M - m) {
        case 3: sweep_rows<3>(buf.data(), nrows, xp + m * K, K, K, op + m * N + n0, N); break;
        case 2: sweep_rows<2>(buf.data(), nrows, xp + m * K, K, K, op + m * N + n0, N); break;
        case 1: sweep_rows<1>(buf.data(), nrows, xp + m * K, K, K, op + m * N + n0, N); break;
      }
    }
  });
}
#else
template <int QT>
void matmul_f32(const float* xp, int64_t M, int64_t K, const uint8_t* wp, int64_t N, int64_t row_bytes, float* op) {
  const int64_t nb = K / kBlock;
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    float w[kBlock];
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t m = 0; m < M; ++m) {
        float acc = 0.0f;
        for (int64_t b = 0; b < nb; ++b) {
          dequant_group_scalar<QT>(wp + n * row_bytes, b, w);
          for (int j = 0; j < kBlock; ++j) acc += w[j] * xp[m * K + b * kBlock + j];
        }
        op[m * N + n] = acc;
      }
  });
}
#endif

// ---- int8 activations (llama.cpp's arithmetic) -----------------------------
// Activations are quantized per 32-element block to int8 with one fp32 scale
// (symmetric, amax/127, round to nearest even), as llama.cpp does for its CPU
// quantized matmuls. The block dot product is then exact integer arithmetic:
//   sum_j (d q_j + m) x_j  ~=  d * dx * sum_j q_j xq_j  +  m * dx * sum_j xq_j,
// i.e. the checkpoint's exact weights times the quantized activations (the
// offset term uses the quantized sum too, so the error is sum_j w_j e_j with
// centred weights, not sum_j (w_j - m) e_j). Each row is quantized and reduced
// on its own, so results do not depend on the batch here either.
struct QuantRows {
  std::vector<int8_t> q;    // (M, K)
  std::vector<float> d;     // (M, K/32) block scales
  std::vector<float> sum;   // (M, K/32) d * sum(q) per block
  std::vector<float> half;  // (M, K/32, 2) d * sum(q) over each block's first and last 16 values
};

QuantRows quantize_rows(const float* x, int64_t M, int64_t K) {
  const int64_t nb = K / kBlock;
  QuantRows r{std::vector<int8_t>(M * K), std::vector<float>(M * nb), std::vector<float>(M * nb),
              std::vector<float>(2 * M * nb)};
  at::parallel_for(0, M * nb, 256, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const float* xb = x + i * kBlock;  // rows are contiguous: block i of the flattened x
      float amax = 0.0f;
      for (int j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(xb[j]));
      const float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
      int8_t* q = r.q.data() + i * kBlock;
      int32_t qsum = 0, qlo = 0;
      for (int j = 0; j < kBlock; ++j) {
        q[j] = static_cast<int8_t>(std::nearbyint(xb[j] * id));
        qsum += q[j];
        if (j == 15) qlo = qsum;
      }
      r.d[i] = d;
      r.sum[i] = d * static_cast<float>(qsum);
      r.half[2 * i] = d * static_cast<float>(qlo);
      r.half[2 * i + 1] = d * static_cast<float>(qsum - qlo);
    }
  });
  return r;
}

#if FM_AVX2
// Per 32-bit lane, the sum of four products of unsigned bytes (u) and signed bytes (s): one
// vpdpbusd where the build has VNNI, else vpmaddubsw + vpmaddwd. Both are exact here, so every
// build gives the same integers: vpmaddubsw saturates a pair's sum at 2^15, and the operands
// stay below it (u <= 63 for Q4/Q5/Q6 integers, u = |w| <= 128 for Q8_0; |s| <= 127, activations being
// rounded onto +-127), at most 2 * 128 * 127 = 32512.
inline __m256i dot_u8s8(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

// One weight block against MR rows of quantized activations, accumulated into
// acc[r]; returns the block's additive term m (0 for Q8_0), which dot_rows_int8
// applies to the rows' block sums at the end.
template <int QT, int MR>
inline float dot_block_int8(const uint8_t* blk, const int8_t* xq, const float* xd, int64_t ldq, int64_t lds,
                            __m256* acc) {
  const float d = _cvtsh_ss(*reinterpret_cast<const uint16_t*>(blk));
  float m = 0.0f;
  __m256i w;  // Q4: 32 unsigned nibbles; Q8_0: signed bytes, sign moved onto x below
  if constexpr (QT == kQ8_0) {
    w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
  } else {
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + (QT == kQ4_1 ? 4 : 2)));
    w = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), mask), _mm_and_si128(v, mask));
    m = QT == kQ4_1 ? _cvtsh_ss(*reinterpret_cast<const uint16_t*>(blk + 2)) : -8.0f * d;
  }
  const __m256i wabs = QT == kQ8_0 ? _mm256_sign_epi8(w, w) : w;
  const __m256 dv = _mm256_set1_ps(d);
  for (int r = 0; r < MR; ++r) {
    __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + r * ldq));
    if constexpr (QT == kQ8_0) xv = _mm256_sign_epi8(xv, w);
    const __m256i dot = dot_u8s8(wabs, xv);
    const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(dot), _mm256_broadcast_ss(xd + r * lds));
    acc[r] = _mm256_fmadd_ps(dv, t, acc[r]);
  }
  return m;
}

// dot_rows_int8 for the 5- and 6-bit types and the K-quants, group by group: the group's
// unsigned integers u_j against the quantized activations, each half (16 values: Q6_K has a
// scale per half) scaled by its own d, and the additive terms mk - o d times the halves' sums:
//   sum_j (d_h (u_j - o) + mk_h) x_j  ~=  dx (d_0 dot_0 + d_1 dot_1) + sum_h (mk_h - o d_h) dx sum_h(xq).
// vpmaddubsw pairs stay exact: u <= 63, 2 * 63 * 127 < 2^15.
template <int QT, int MR>
inline void dot_rows_int8_groups(const uint8_t* wrow, int64_t nb, const QuantRows& x, int64_t row0, int64_t K,
                                 float* out, int64_t ldo) {
  constexpr int64_t BB = block_bytes_of(QT) * kBlock / block_weights_of(QT);  // bytes per group, for prefetch
  constexpr int64_t kAhead = MR == 1 ? 2048 : MR == 2 ? 1024 : 0;
  const int8_t* xq = x.q.data() + row0 * K;
  const float* xd = x.d.data() + row0 * nb;
  const float* xh = x.half.data() + 2 * row0 * nb;
  __m256 acc[MR];
  float mterm[MR][2];
  for (int r = 0; r < MR; ++r) {
    acc[r] = _mm256_setzero_ps();
    mterm[r][0] = mterm[r][1] = 0.0f;
  }
  for (int64_t g = 0; g < nb; ++g) {
    if constexpr (kAhead > 0) _mm_prefetch(reinterpret_cast<const char*>(wrow + g * BB + kAhead), _MM_HINT_T0);
    int s;
    const uint8_t* b = group_block<QT>(wrow, g, s);
    const __m256i u = group_u8_avx2<QT>(b, s);
    const GroupScales sc = group_scales<QT>(b, s);
    // lanes 0-3 of a dot product hold values 0-15 of the group, lanes 4-7 values 16-31
    const __m256 dv = _mm256_set_m128(_mm_set1_ps(sc.d[1]), _mm_set1_ps(sc.d[0]));
    const float m0 = sc.mk[0] - static_cast<float>(sc.o) * sc.d[0], m1 = sc.mk[1] - static_cast<float>(sc.o) * sc.d[1];
    for (int r = 0; r < MR; ++r) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + r * K + g * kBlock));
      const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(dot_u8s8(u, xv)), _mm256_broadcast_ss(xd + r * nb + g));
      acc[r] = _mm256_fmadd_ps(dv, t, acc[r]);
      const float* h = xh + 2 * (r * nb + g);
      mterm[r][g & 1] += m0 * h[0] + m1 * h[1];  // two chains, as the block sums alternate
    }
  }
  for (int r = 0; r < MR; ++r) out[r * ldo] = hsum(acc[r]) + (mterm[r][0] + mterm[r][1]);
}

// out[r * ldo] = row `row0 + r` of x times weight row `wrow`, for MR rows at
// once. Even and odd blocks go to separate accumulators so the FMA chain is
// not latency bound.
template <int QT, int MR>
inline void dot_rows_int8_blocks(const uint8_t* wrow, int64_t nb, const QuantRows& x, int64_t row0, int64_t K,
                                 float* out, int64_t ldo) {
  constexpr int64_t BB = block_bytes_of(QT);
  const int8_t* xq = x.q.data() + row0 * K;
  const float* xd = x.d.data() + row0 * nb;
  const float* xs = x.sum.data() + row0 * nb;
  float mblk[kMaxBlocks];
  __m256 even[MR], odd[MR];
  for (int r = 0; r < MR; ++r) even[r] = odd[r] = _mm256_setzero_ps();
  int64_t b = 0;
  // One weight-row stream at a time: at one or two activation rows too little compute hides the
  // memory latency, so ask for the row's data ahead (as in rows_direct_f32).
  constexpr int64_t kAhead = MR == 1 ? 2048 : MR == 2 ? 1024 : 0;
  for (; b + 2 <= nb; b += 2) {
    if constexpr (kAhead > 0) _mm_prefetch(reinterpret_cast<const char*>(wrow + b * BB + kAhead), _MM_HINT_T0);
    mblk[b] = dot_block_int8<QT, MR>(wrow + b * BB, xq + b * kBlock, xd + b, K, nb, even);
    mblk[b + 1] = dot_block_int8<QT, MR>(wrow + (b + 1) * BB, xq + (b + 1) * kBlock, xd + b + 1, K, nb, odd);
  }
  if (b < nb) mblk[b] = dot_block_int8<QT, MR>(wrow + b * BB, xq + b * kBlock, xd + b, K, nb, even);
  for (int r = 0; r < MR; ++r) {
    float mterm = 0.0f;
    if constexpr (QT != kQ8_0) {  // four partial sums: one serial chain of nb FMAs would stall a row
      float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      int64_t j = 0;
      for (; j + 4 <= nb; j += 4)
        for (int u = 0; u < 4; ++u) part[u] += mblk[j + u] * xs[r * nb + j + u];
      for (; j < nb; ++j) part[0] += mblk[j] * xs[r * nb + j];
      mterm = (part[0] + part[1]) + (part[2] + part[3]);
    }
    out[r * ldo] = hsum(_mm256_add_ps(even[r], odd[r])) + mterm;
  }
}

template <int QT, int MR>
inline void dot_rows_int8(const uint8_t* wrow, int64_t nb, const QuantRows& x, int64_t row0, int64_t K, float* out,
                          int64_t ldo) {
  if constexpr (is_simple(QT))
    dot_rows_int8_blocks<QT, MR>(wrow, nb, x, row0, K, out, ldo);
  else
    dot_rows_int8_groups<QT, MR>(wrow, nb, x, row0, K, out, ldo);
}

template <int QT>
void matmul_int8(const QuantRows& xq, int64_t M, int64_t K, const uint8_t* wp, int64_t N, int64_t row_bytes,
                 float* op) {
  const int64_t nb = K / kBlock;
  constexpr int64_t kChunk = 32;
  at::parallel_for(0, (N + kChunk - 1) / kChunk, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t n0 = c * kChunk, n1 = std::min(N, n0 + kChunk);
      int64_t m = 0;
      for (; m + 4 <= M; m += 4)
        for (int64_t n = n0; n < n1; ++n) dot_rows_int8<QT, 4>(wp + n * row_bytes, nb, xq, m, K, op + m * N + n, N);
      for (; m + 2 <= M; m += 2)
        for (int64_t n = n0; n < n1; ++n) dot_rows_int8<QT, 2>(wp + n * row_bytes, nb, xq, m, K, op + m * N + n, N);
      for (; m < M; ++m)
        for (int64_t n = n0; n < n1; ++n) dot_rows_int8<QT, 1>(wp + n * row_bytes, nb, xq, m, K, op + m * N + n, N);
    }
  });
}
#else
// The portable path: the same quantized-activation arithmetic, one element at a time.
template <int QT>
void matmul_int8(const QuantRows& xq, int64_t M, int64_t K, const uint8_t* wp, int64_t N, int64_t row_bytes,
                 float* op) {
  const int64_t nb = K / kBlock;
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t row = 0; row < M; ++row) {
        float acc = 0.0f;
        for (int64_t b = 0; b < nb; ++b) {
          const int64_t i = row * nb + b;
          const int8_t* xs = xq.q.data() + i * kBlock;
          if constexpr (!is_simple(QT)) {  // per group and half, as dot_rows_int8_groups
            int s;
            const uint8_t* blk = group_block<QT>(wp + n * row_bytes, b, s);
            uint8_t u[kBlock];
            group_u8_scalar<QT>(blk, s, u);
            const GroupScales sc = group_scales<QT>(blk, s);
            int32_t dot[2] = {0, 0};
            for (int j = 0; j < kBlock; ++j) dot[j / 16] += u[j] * xs[j];
            for (int h = 0; h < 2; ++h)
              acc += sc.d[h] * xq.d[i] * static_cast<float>(dot[h]) +
                     (sc.mk[h] - static_cast<float>(sc.o) * sc.d[h]) * xq.half[2 * i + h];
          } else {
            const uint8_t* blk = wp + n * row_bytes + b * block_bytes_of(QT);
            const float d = half_to_float(blk);
            int32_t dot = 0;
            float m = 0.0f;
            if (QT == kQ8_0) {
              const int8_t* qs = reinterpret_cast<const int8_t*>(blk + 2);
              for (int j = 0; j < kBlock; ++j) dot += qs[j] * xs[j];
            } else {
              const uint8_t* qs = blk + (QT == kQ4_1 ? 4 : 2);
              for (int j = 0; j < 16; ++j) dot += (qs[j] & 0x0F) * xs[j] + (qs[j] >> 4) * xs[j + 16];
              m = QT == kQ4_1 ? half_to_float(blk + 2) : -8.0f * d;
            }
            acc += d * xq.d[i] * static_cast<float>(dot) + m * xq.sum[i];
          }
        }
        op[row * N + n] = acc;
      }
  });
}
#endif

template <int QT>
void matmul(const float* xp, int64_t M, int64_t K, const uint8_t* wp, int64_t N, int64_t row_bytes, float* op,
            bool int8_activations) {
  if (int8_activations) matmul_int8<QT>(quantize_rows(xp, M, K), M, K, wp, N, row_bytes, op);
  // Past the direct path's rows, AMX where built and granted: the tile products cost the same at
  // 9 rows as at 16, and beat the FMAs there (docs/kernels.md).
  else if (M <= kDirectMaxRows || !amx_matmul(xp, M, K, wp, N, row_bytes, QT, op))
    matmul_f32<QT>(xp, M, K, wp, N, row_bytes, op);
}

void check_weight(const torch::Tensor& w, int64_t qtype, int64_t k) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == torch::kUInt8 && w.is_contiguous(),
              "fastmode kernels: weight must be a contiguous 2-D uint8 tensor of ggml blocks");
  const int64_t bytes = block_bytes(qtype), per = block_weights_of(qtype);
  TORCH_CHECK(k > 0 && k % per == 0 && k <= kBlock * kMaxBlocks, "fastmode kernels: in_features must be a positive multiple of ",
              per, " (the type's block) up to ", kBlock * kMaxBlocks, ", got ", k);
  TORCH_CHECK(w.size(1) == k / per * bytes, "fastmode kernels: weight rows hold ", w.size(1), " bytes; ", k,
              " features of this type need ", k / per * bytes);
}

// One row of blocks -> k fp32 values.
template <int QT>
inline void dequant_row(const uint8_t* wrow, int64_t k, float* o) {
  for (int64_t g = 0; g < k / kBlock; ++g, o += kBlock) {
#if FM_AVX2
    __m256 w[4];
    dequant_group_avx2<QT>(wrow, g, w);
    for (int i = 0; i < 4; ++i) _mm256_storeu_ps(o + 8 * i, w[i]);
#else
    dequant_group_scalar<QT>(wrow, g, o);
#endif
  }
}

}  // namespace

// x: (M, K) fp32; w: (N, K / block weights * block bytes) uint8. Returns (M, N) fp32.
// int8_activations: quantize x per 32-value block to int8 (llama.cpp's
// arithmetic) instead of multiplying the fp32 values.
torch::Tensor quant_matmul(torch::Tensor x, torch::Tensor w, int64_t qtype, bool int8_activations) {
  // A weight repacked by pack_weight (packed_int8.cpp) is named by its type plus kPacked; it always
  // takes int8 activations.
  if (qtype >= kPacked) return packed_matmul(x, w, qtype - kPacked);
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat, "fastmode kernels: x must be 2-D fp32");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  check_weight(w, qtype, K);
  x = x.contiguous();
  auto out = torch::empty({M, N}, x.options());
  if (M == 0) return out;
  const uint8_t* wp = w.data_ptr<uint8_t>();
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t row_bytes = w.size(1);
  with_qtype(qtype, [&](auto t) { matmul<decltype(t)::value>(xp, M, K, wp, N, row_bytes, op, int8_activations); });
  return out;
}

// Rows `rows` of the weight (all rows when rows is empty), dequantized to (R, K) fp32.
torch::Tensor quant_dequantize(torch::Tensor w, int64_t qtype, int64_t k, torch::Tensor rows) {
  check_weight(w, qtype, k);
  const bool all = rows.numel() == 0;
  const int64_t R = all ? w.size(0) : rows.numel();
  auto idx = all ? rows : rows.to(torch::kLong).contiguous();
  const int64_t* ip = all ? nullptr : idx.data_ptr<int64_t>();
  const int64_t N = w.size(0);
  for (int64_t r = 0; !all && r < R; ++r)
    TORCH_CHECK(ip[r] >= 0 && ip[r] < N, "fastmode kernels: row ", ip[r], " out of range for ", N, " rows");
  auto out = torch::empty({R, k}, torch::dtype(torch::kFloat));
  const int64_t row_bytes = w.size(1);
  const uint8_t* wp = w.data_ptr<uint8_t>();
  float* op = out.data_ptr<float>();
  with_qtype(qtype, [&](auto t) {
    at::parallel_for(0, R, 64, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) dequant_row<decltype(t)::value>(wp + (all ? r : ip[r]) * row_bytes, k, op + r * k);
    });
  });
  return out;
}

bool has_avx2() { return FM_AVX2; }

// The ISA path this library was built for (fastmode.kernels.ISA_PATHS), from what the compiler
// was told the CPU has: the Python side checks it against the path it asked for.
std::string isa() {
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && FM_AVX512 && defined(__AVX512VNNI__)
  return "amx";
#elif FM_AVX512 && defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return "avx512_vnni";
#elif FM_AVX512
  return "avx512";
#elif FM_AVX2 && defined(__AVXVNNI__)
  return "avx2_vnni";
#elif FM_AVX2
  return "avx2";
#else
  return "portable";
#endif
}

// How the int8-activation path forms its integer dot products.
std::string int8_dot() {
#if FM_AVX2 && ((defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__))
  return "vpdpbusd";
#elif FM_AVX2
  return "vpmaddubsw+vpmaddwd";
#else
  return "scalar";
#endif
}

// Activation rows up to which the matmul reads the blocks directly; more rows take another
// kernel (a dequantized buffer, or AMX tiles), so a step's time bends here.
int64_t direct_max_rows() { return kDirectMaxRows; }

// The vector width the fp32 path was built for: 16 (AVX-512), 8 (AVX2) or 1 (portable).
int64_t fp32_lanes() {
#if FM_AVX2
  return kLanes;
#else
  return 1;
#endif
}
