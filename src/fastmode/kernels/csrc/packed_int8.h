// Torch-free core of the packed int8 kernels: the layout, the activation quantizer and the matmul
// kernels. packed_int8.cpp binds them to tensors; its opening comment explains the design.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define PK_AVX2 1
#else
#define PK_AVX2 0
#endif

namespace fastmode::packed {

constexpr int kRows = 8;    // output rows per group
constexpr int kBlock = 32;  // weights per block
constexpr int64_t kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 8;

constexpr int64_t file_block_bytes(int64_t qt) { return qt == kQ4_0 ? 18 : qt == kQ4_1 ? 20 : qt == kQ8_0 ? 34 : -1; }
constexpr int64_t weight_bytes(int64_t qt) { return qt == kQ8_0 ? 32 : 16; }  // per row and block
constexpr int64_t scale_bytes(int64_t qt) { return qt == kQ4_1 ? 4 : 2; }     // per row and block
constexpr int64_t record_bytes(int64_t qt) { return kRows * (scale_bytes(qt) + weight_bytes(qt)); }

constexpr bool packable(int64_t qt) { return file_block_bytes(qt) > 0; }

// An IEEE fp16 value (little-endian bytes) as fp32, exactly.
inline float fp16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
#if PK_AVX2
  return _cvtsh_ss(h);
#else
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (man << 13);  // inf, nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: man * 2^-24, exact in fp32
    const float v = static_cast<float>(man) * 5.9604644775390625e-08f;
    std::memcpy(&bits, &v, 4);
    bits |= sign;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
#endif
}

// ---- activations ------------------------------------------------------------------------------
// Row i of x quantized per 32 values: q (M, K) int8; d (M, nb) scales; s (M, nb) = d * sum(q)
// (Q4_1's minimum term); qsum (M, nb) = sum(q) (Q4_0's offset). One buffer reused per thread.
struct Activations {
  std::vector<int8_t> q;
  std::vector<float> d, s;
  std::vector<int32_t> qsum;
};

inline void quantize_block(const float* x, int8_t* q, float& d, float& s, int32_t& qsum) {
  float amax = 0.0f;
  int j = 0;
#if PK_AVX2
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 mx = _mm256_setzero_ps();
  for (; j < kBlock; j += 8) mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  amax = _mm_cvtss_f32(m4);
#else
  for (; j < kBlock; ++j) amax = std::max(amax, std::fabs(x[j]));
#endif
  d = amax / 127.0f;
  const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
  int32_t sum = 0;
#if PK_AVX2
  // x * id rounded to nearest even (the default MXCSR mode, as std::nearbyint), |q| <= 127.
  const __m256 idv = _mm256_set1_ps(id);
  __m256i v[4];
  for (int k = 0; k < 4; ++k) v[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), idv));
  const __m256i s01 = _mm256_add_epi32(v[0], v[1]), s23 = _mm256_add_epi32(v[2], v[3]);
  __m256i t = _mm256_add_epi32(s01, s23);
  __m128i t4 = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
  t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0x4E));
  t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0xB1));
  sum = _mm_cvtsi128_si32(t4);
  // int32 -> int8 in order: packs interleave 128-bit lanes, one dword permute puts them back.
  const __m256i p16a = _mm256_packs_epi32(v[0], v[1]), p16b = _mm256_packs_epi32(v[2], v[3]);
  const __m256i p8 = _mm256_packs_epi16(p16a, p16b);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q),
                      _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
#else
  for (j = 0; j < kBlock; ++j) {
    q[j] = static_cast<int8_t>(std::nearbyint(x[j] * id));
    sum += q[j];
  }
#endif
  qsum = sum;
  s = d * static_cast<float>(sum);
}

// `par(begin, end, grain, f)` runs f over [begin, end) in chunks (at::parallel_for in the bindings).
template <class Par>
Activations& quantize_activations(const float* x, int64_t M, int64_t K, Par&& par) {
  // The calling thread's buffer: named through a reference, since a thread_local used inside the
  // lambda below would be each worker thread's own.
  thread_local Activations buffer;
  Activations& a = buffer;
  const int64_t nb = K / kBlock;
  if (static_cast<int64_t>(a.q.size()) < M * K) a.q.resize(M * K);
  if (static_cast<int64_t>(a.d.size()) < M * nb) {
    a.d.resize(M * nb);
    a.s.resize(M * nb);
    a.qsum.resize(M * nb);
  }
  auto work = [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) quantize_block(x + i * kBlock, a.q.data() + i * kBlock, a.d[i], a.s[i], a.qsum[i]);
  };
  if (M * nb < 512)
    work(0, M * nb);  // a decode step's rows: less work than waking the other threads
  else
    par(0, M * nb, 256, work);
  return a;
}

// ---- the portable reference: the documented chain, one output at a time -----------------------
template <int QT, class Par>
void matmul_scalar(const Activations& a, int64_t M, int64_t K, const uint8_t* wp, int64_t N, float* op, Par&& par) {
  const int64_t nb = K / kBlock, RB = record_bytes(QT), groups = N / kRows;
  par(0, groups, 1, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g)
      for (int r = 0; r < kRows; ++r)
        for (int64_t i = 0; i < M; ++i) {
          float acc = 0.0f;
          for (int64_t b = 0; b < nb; ++b) {
            const uint8_t* rec = wp + (g * nb + b) * RB;
            const uint8_t* ws = rec + kRows * scale_bytes(QT);
            const int8_t* xq = a.q.data() + i * K + b * kBlock;
            int32_t isum = 0;
            for (int c = 0; c < weight_bytes(QT) / 4; ++c)
              for (int t = 0; t < 4; ++t) {
                const uint8_t byte = ws[c * 4 * kRows + r * 4 + t];
                const int j = 4 * c + t;  // the row's byte j
                if constexpr (QT == kQ8_0) {
                  isum += static_cast<int8_t>(byte) * xq[j];
                } else {
                  isum += (byte & 0x0F) * xq[j] + (byte >> 4) * xq[j + 16];
                }
              }
            if constexpr (QT == kQ4_0) isum -= 8 * a.qsum[i * nb + b];
            acc = std::fma(fp16(rec + 2 * r) * a.d[i * nb + b], static_cast<float>(isum), acc);
            if constexpr (QT == kQ4_1) acc = std::fma(fp16(rec + 2 * kRows + 2 * r), a.s[i * nb + b], acc);
          }
          op[i * N + g * kRows + r] = acc;
        }
  });
}

#if PK_AVX2
// ---- AVX2: a group's eight rows in the eight lanes ---------------------------------------------
// MR activation rows at a time. Per block and chunk the nibbles are split once (Q4) and every
// row's four activation bytes of that chunk are broadcast to all lanes. Q4 products go into 16-bit
// lanes: one lane pair per weight row, eight chunk products per block, each at most 2 * 15 * 127,
// so the sum (<= 30480) stays exact; one vpmaddwd then gives each row's block sum. Q8_0 products
// (up to 2 * 128 * 127 per pair) are widened per chunk.
template <int QT, int MR>
inline void group_rows_avx2(const uint8_t* grp, int64_t nb, const Activations& a, int64_t K, int64_t i0, float* out,
                            int64_t ldo) {
  constexpr int64_t RB = record_bytes(QT);
  const __m256i ones16 = _mm256_set1_epi16(1);
  const __m256i nib = _mm256_set1_epi8(0x0F);
  __m256 acc[MR];
  for (int r = 0; r < MR; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* rec = grp + b * RB;
    _mm_prefetch(reinterpret_cast<const char*>(rec + 4 * RB), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(rec + 4 * RB + 64), _MM_HINT_T0);
    if constexpr (RB > 128) _mm_prefetch(reinterpret_cast<const char*>(rec + 4 * RB + 128), _MM_HINT_T0);
    if constexpr (RB > 192) _mm_prefetch(reinterpret_cast<const char*>(rec + 4 * RB + 192), _MM_HINT_T0);
    const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec)));
    const uint8_t* ws = rec + kRows * scale_bytes(QT);
    __m256i isum[MR];
    if constexpr (QT == kQ8_0) {
      for (int r = 0; r < MR; ++r) isum[r] = _mm256_setzero_si256();
      for (int c = 0; c < 8; ++c) {
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ws + 32 * c));
        const __m256i wa = _mm256_sign_epi8(w, w);
        for (int r = 0; r < MR; ++r) {
          int32_t xb;
          std::memcpy(&xb, a.q.data() + (i0 + r) * K + b * kBlock + 4 * c, 4);
          const __m256i xs = _mm256_sign_epi8(_mm256_set1_epi32(xb), w);
          isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(_mm256_maddubs_epi16(wa, xs), ones16));
        }
      }
    } else {
      __m256i s16[MR];
      for (int r = 0; r < MR; ++r) s16[r] = _mm256_setzero_si256();
      for (int c = 0; c < 4; ++c) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ws + 32 * c));
        const __m256i lo = _mm256_and_si256(v, nib);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
        for (int r = 0; r < MR; ++r) {
          const int8_t* xq = a.q.data() + (i0 + r) * K + b * kBlock + 4 * c;
          int32_t xl, xh;
          std::memcpy(&xl, xq, 4);
          std::memcpy(&xh, xq + 16, 4);
          s16[r] = _mm256_add_epi16(s16[r], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(xl)));
          s16[r] = _mm256_add_epi16(s16[r], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(xh)));
        }
      }
      for (int r = 0; r < MR; ++r) {
        isum[r] = _mm256_madd_epi16(s16[r], ones16);
        if constexpr (QT == kQ4_0)
          isum[r] = _mm256_sub_epi32(isum[r], _mm256_set1_epi32(8 * a.qsum[(i0 + r) * nb + b]));
      }
    }
    for (int r = 0; r < MR; ++r) {
      const __m256 scale = _mm256_mul_ps(d8, _mm256_set1_ps(a.d[(i0 + r) * nb + b]));
      acc[r] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(isum[r]), acc[r]);
    }
    if constexpr (QT == kQ4_1) {
      const __m256 m8 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + 2 * kRows)));
      for (int r = 0; r < MR; ++r) acc[r] = _mm256_fmadd_ps(m8, _mm256_set1_ps(a.s[(i0 + r) * nb + b]), acc[r]);
    }
  }
  for (int r = 0; r < MR; ++r) _mm256_storeu_ps(out + r * ldo, acc[r]);
}

template <int QT, class Par>
void matmul_avx2(const Activations& a, int64_t M, int64_t K, const uint8_t* wp, int64_t N, float* op, Par&& par) {
  const int64_t nb = K / kBlock, RB = record_bytes(QT), groups = N / kRows;
  // A task: a run of groups, each against every activation row, MR rows at a time (the nibbles
  // of a record are split once per MR rows). Groups are split statically between the threads.
  par(0, groups, 4, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const uint8_t* grp = wp + g * nb * RB;
      float* out = op + g * kRows;
      int64_t i = 0;
      for (; i + 4 <= M; i += 4) group_rows_avx2<QT, 4>(grp, nb, a, K, i, out + i * N, N);
      switch (M - i) {
        case 3: group_rows_avx2<QT, 3>(grp, nb, a, K, i, out + i * N, N); break;
        case 2: group_rows_avx2<QT, 2>(grp, nb, a, K, i, out + i * N, N); break;
        case 1: group_rows_avx2<QT, 1>(grp, nb, a, K, i, out + i * N, N); break;
      }
    }
  });
}
#endif

// Runs f(std::integral_constant<int, QT>) for a packable type id.
template <class F>
void with_packable(int64_t qt, F&& f) {
  if (qt == kQ4_0) f(std::integral_constant<int, kQ4_0>());
  else if (qt == kQ4_1) f(std::integral_constant<int, kQ4_1>());
  else f(std::integral_constant<int, kQ8_0>());
}

}  // namespace fastmode::packed
