// The default arithmetic for 32-weight blocks (Q4_0, Q4_1, Q8_0): int8 activations against the
// checkpoint's blocks, repacked at load so that one vector instruction serves eight output rows.
//
// Why repack: at one activation row a matmul streams every weight once and does little with
// each, so what bounds it is how many instructions a block costs and whether the memory system
// is kept busy. In the file's layout each block's scale sits in front of its nibbles and a row's
// integer dot product ends in a horizontal sum. Here eight rows' blocks are interleaved four bytes
// at a time, so an integer multiply-add (vpmaddubsw) covers four weights of each of eight rows,
// the per-row sums come out one per 32-bit lane with no horizontal reduction, and the eight rows'
// fp16 scales load and convert as one vector. The same record serves many activation rows: the
// unpacked nibbles stay in registers while each row's activations are multiplied in.
//
// Layout (`pack_weight`): output rows in groups of 8 (a packed weight has a multiple of 8 rows); per
// group, one record per 32-weight block, in block order; records of a group contiguous, groups
// contiguous. A record is
//   Q4_0: 8 fp16 scales d, then 128 bytes of nibbles                  (144 bytes)
//   Q4_1: 8 fp16 scales d, 8 fp16 minimums m, then 128 bytes of nibbles (160 bytes)
//   Q8_0: 8 fp16 scales d, then 256 bytes of int8 weights             (272 bytes)
// where the weight bytes are the rows' own bytes in 4-byte chunks: chunk c holds bytes 4c..4c+3
// of row 0, then of row 1, ..., row 7. A Q4 row's 16 bytes hold weights j (low nibble) and j + 16
// (high nibble) in byte j, as in the file; a Q8_0 row's 32 bytes are weights 0..31. Same bytes per
// weight as the file: the repack moves bytes, it changes no value (`unpack_weight` restores the
// file's blocks exactly).
//
// Numerics (every path and every batch alike, so a row's result never depends on its batch and
// greedy speculation stays exact): each activation row is quantized per 32 values to int8
// (dx = amax/127, q = round-to-nearest-even(x 127/amax)), the same as the file-layout int8 path.
// Per output (weight row n, activation row i), over the blocks b in order, one fp32 chain:
//   acc = fma(d_nb * dx_ib, float(isum_nib), acc)          isum: the block's exact integer dot
//   acc = fma(m_nb, dx_ib * sum_j xq_ibj, acc)             Q4_1 only (its minimum)
// with isum = sum_j u_j xq_j - 8 sum_j xq_j for Q4_0 (weights u - 8) and sum_j w_j xq_j for Q8_0.
// The integer dot is exact however it is summed, and the fp32 operations are the same ones in
// the same order on every path, so the vector kernels, the portable loop and any batch give
// bit-identical outputs.

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>

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

namespace {

constexpr int kRows = 8;    // output rows per group
constexpr int kBlock = 32;  // weights per block
constexpr int64_t kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 8;

constexpr int64_t file_block_bytes(int64_t qt) { return qt == kQ4_0 ? 18 : qt == kQ4_1 ? 20 : qt == kQ8_0 ? 34 : -1; }
constexpr int64_t weight_bytes(int64_t qt) { return qt == kQ8_0 ? 32 : 16; }  // per row and block
constexpr int64_t scale_bytes(int64_t qt) { return qt == kQ4_1 ? 4 : 2; }     // per row and block
constexpr int64_t record_bytes(int64_t qt) { return kRows * (scale_bytes(qt) + weight_bytes(qt)); }

void check_packable(int64_t qt) {
  TORCH_CHECK(file_block_bytes(qt) > 0, "fastmode kernels: only Q4_0 (2), Q4_1 (3) and Q8_0 (8) are packed, got type ",
              qt);
}

inline float fp16(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
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

Activations& quantize_activations(const float* x, int64_t M, int64_t K) {
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
    at::parallel_for(0, M * nb, 256, work);
  return a;
}

// ---- the portable reference: the documented chain, one output at a time -----------------------
template <int QT>
void matmul_scalar(const Activations& a, int64_t M, int64_t K, const uint8_t* wp, int64_t N, float* op) {
  const int64_t nb = K / kBlock, RB = record_bytes(QT), groups = N / kRows;
  at::parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) {
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

template <int QT>
void matmul_avx2(const Activations& a, int64_t M, int64_t K, const uint8_t* wp, int64_t N, float* op) {
  const int64_t nb = K / kBlock, RB = record_bytes(QT), groups = N / kRows;
  // A task: a run of groups, each against every activation row, MR rows at a time (the nibbles
  // of a record are split once per MR rows). Groups are split statically between the threads.
  at::parallel_for(0, groups, 4, [&](int64_t g0, int64_t g1) {
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

template <class F>
void with_packable(int64_t qt, F&& f) {
  check_packable(qt);
  if (qt == kQ4_0) f(std::integral_constant<int, kQ4_0>());
  else if (qt == kQ4_1) f(std::integral_constant<int, kQ4_1>());
  else f(std::integral_constant<int, kQ8_0>());
}

}  // namespace

// The file's blocks (N, K/32 * block bytes) -> the packed layout (groups * K/32, record bytes).
torch::Tensor pack_weight(torch::Tensor w, int64_t qtype, int64_t k) {
  check_packable(qtype);
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == torch::kUInt8 && w.is_contiguous(),
              "pack_weight: w must be a contiguous 2-D uint8 tensor of ggml blocks");
  TORCH_CHECK(k > 0 && k % kBlock == 0 && w.size(1) == k / kBlock * file_block_bytes(qtype),
              "pack_weight: rows of ", w.size(1), " bytes do not hold ", k, " weights of type ", qtype);
  const int64_t N = w.size(0), nb = k / kBlock, groups = N / kRows;
  TORCH_CHECK(N % kRows == 0, "pack_weight: ", N, " rows are not a multiple of ", kRows);
  const int64_t FB = file_block_bytes(qtype), RB = record_bytes(qtype), SB = scale_bytes(qtype), WB = weight_bytes(qtype);
  auto out = torch::empty({groups * nb, RB}, torch::kUInt8);
  const uint8_t* src = w.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  at::parallel_for(0, groups, 16, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g)
      for (int64_t b = 0; b < nb; ++b) {
        uint8_t* rec = dst + (g * nb + b) * RB;
        for (int r = 0; r < kRows; ++r) {
          const uint8_t* blk = src + (g * kRows + r) * w.size(1) + b * FB;
          std::memcpy(rec + 2 * r, blk, 2);                                       // d
          if (SB == 4) std::memcpy(rec + 2 * kRows + 2 * r, blk + 2, 2);          // m
          for (int64_t c = 0; c < WB / 4; ++c) std::memcpy(rec + kRows * SB + c * 4 * kRows + 4 * r, blk + SB + 4 * c, 4);
        }
      }
  });
  return out;
}

// The packed layout back to the file's blocks: exactly the bytes pack_weight read.
torch::Tensor unpack_weight(torch::Tensor p, int64_t qtype, int64_t k) {
  check_packable(qtype);
  TORCH_CHECK(k > 0 && k % kBlock == 0, "unpack_weight: in_features must be a positive multiple of 32");
  const int64_t nb = k / kBlock, groups = p.size(0) / nb, n = groups * kRows;
  const int64_t FB = file_block_bytes(qtype), RB = record_bytes(qtype), SB = scale_bytes(qtype), WB = weight_bytes(qtype);
  TORCH_CHECK(p.dim() == 2 && p.scalar_type() == torch::kUInt8 && p.is_contiguous() && p.size(0) % nb == 0 &&
                  p.size(1) == RB,
              "unpack_weight: not a packed weight of ", k, " features and type ", qtype);
  auto out = torch::empty({n, nb * FB}, torch::kUInt8);
  const uint8_t* src = p.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  at::parallel_for(0, groups, 16, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g)
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* rec = src + (g * nb + b) * RB;
        for (int r = 0; r < kRows; ++r) {
          uint8_t* blk = dst + (g * kRows + r) * nb * FB + b * FB;
          std::memcpy(blk, rec + 2 * r, 2);
          if (SB == 4) std::memcpy(blk + 2, rec + 2 * kRows + 2 * r, 2);
          for (int64_t c = 0; c < WB / 4; ++c) std::memcpy(blk + SB + 4 * c, rec + kRows * SB + c * 4 * kRows + 4 * r, 4);
        }
      }
  });
  return out;
}

// The packed weight's output rows, checked against x's K features.
int64_t packed_rows(const torch::Tensor& p, int64_t qtype, int64_t K, const char* who) {
  check_packable(qtype);
  const int64_t nb = K / kBlock;
  TORCH_CHECK(K > 0 && K % kBlock == 0 && p.dim() == 2 && p.scalar_type() == torch::kUInt8 && p.is_contiguous() &&
                  p.size(0) % nb == 0 && p.size(1) == record_bytes(qtype),
              who, ": the weight is not a packed weight of ", K, " input features and type ", qtype);
  return p.size(0) / nb * kRows;
}

// x (M, K) fp32 times a packed weight -> (M, N) fp32, int8 activations (see the top).
torch::Tensor packed_matmul(torch::Tensor x, torch::Tensor p, int64_t qtype) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat, "packed_matmul: x must be 2-D fp32");
  const int64_t M = x.size(0), K = x.size(1), n = packed_rows(p, qtype, K, "packed_matmul");
  x = x.contiguous();
  auto out = torch::empty({M, n}, x.options());
  if (M == 0 || n == 0) return out;
  const Activations& a = quantize_activations(x.data_ptr<float>(), M, K);
  const uint8_t* wp = p.data_ptr<uint8_t>();
  float* op = out.data_ptr<float>();
  with_packable(qtype, [&](auto t) {
#if PK_AVX2
    matmul_avx2<decltype(t)::value>(a, M, K, wp, n, op);
#else
    matmul_scalar<decltype(t)::value>(a, M, K, wp, n, op);
#endif
  });
  return out;
}

// The same product through the portable loop, whatever the build: the reference the vector
// kernels must equal bit for bit.
torch::Tensor packed_matmul_reference(torch::Tensor x, torch::Tensor p, int64_t qtype) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat, "packed_matmul_reference: x must be 2-D fp32");
  x = x.contiguous();
  const int64_t M = x.size(0), K = x.size(1), n = packed_rows(p, qtype, K, "packed_matmul_reference");
  auto out = torch::empty({M, n}, x.options());
  if (M == 0 || n == 0) return out;
  // The scalar quantizer, so the reference does not share the vector code it checks.
  Activations a;
  const int64_t nb = K / kBlock;
  a.q.resize(M * K);
  a.d.resize(M * nb);
  a.s.resize(M * nb);
  a.qsum.resize(M * nb);
  const float* xp = x.data_ptr<float>();
  for (int64_t i = 0; i < M * nb; ++i) {
    const float* xb = xp + i * kBlock;
    float amax = 0.0f;
    for (int j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
    int32_t sum = 0;
    for (int j = 0; j < kBlock; ++j) {
      a.q[i * kBlock + j] = static_cast<int8_t>(std::nearbyint(xb[j] * id));
      sum += a.q[i * kBlock + j];
    }
    a.d[i] = d;
    a.qsum[i] = sum;
    a.s[i] = d * static_cast<float>(sum);
  }
  with_packable(qtype, [&](auto t) { matmul_scalar<decltype(t)::value>(a, M, K, p.data_ptr<uint8_t>(), n, out.data_ptr<float>()); });
  return out;
}

// Rows `rows` of a packed weight, dequantized to (R, K) fp32: the values the file's blocks encode
// (d q + m, exact in fp32 for these types), for embedding lookups in a tied, packed table.
torch::Tensor packed_dequantize(torch::Tensor p, int64_t qtype, int64_t k, torch::Tensor rows) {
  const int64_t N = packed_rows(p, qtype, k, "packed_dequantize"), nb = k / kBlock;
  auto idx = rows.to(torch::kLong).contiguous();
  const int64_t R = idx.numel();
  const int64_t* ip = idx.data_ptr<int64_t>();
  for (int64_t i = 0; i < R; ++i) TORCH_CHECK(ip[i] >= 0 && ip[i] < N, "packed_dequantize: row ", ip[i], " out of range for ", N, " rows");
  auto out = torch::empty({R, k}, torch::kFloat);
  const uint8_t* wp = p.data_ptr<uint8_t>();
  float* op = out.data_ptr<float>();
  const int64_t RB = record_bytes(qtype), SB = scale_bytes(qtype);
  at::parallel_for(0, R, 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t g = ip[i] / kRows, r = ip[i] % kRows;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* rec = wp + (g * nb + b) * RB;
        const uint8_t* ws = rec + kRows * SB;
        const float d = fp16(rec + 2 * r), m = qtype == kQ4_1 ? fp16(rec + 2 * kRows + 2 * r) : 0.0f;
        float* o = op + i * k + b * kBlock;
        for (int64_t j = 0; j < weight_bytes(qtype); ++j) {
          const uint8_t byte = ws[(j / 4) * 4 * kRows + 4 * r + j % 4];
          if (qtype == kQ8_0) {
            o[j] = d * static_cast<float>(static_cast<int8_t>(byte));
          } else {
            const int off = qtype == kQ4_0 ? 8 : 0;
            o[j] = d * static_cast<float>((byte & 0x0F) - off) + m;
            o[j + 16] = d * static_cast<float>((byte >> 4) - off) + m;
          }
        }
      }
    }
  });
  return out;
}
