// The fp32-activation quantized matmul on Intel AMX (Sapphire Rapids and later), where the
// CPU has AMX-BF16 and the OS grants the tile state.
//
// Why AMX: one TDPBF16PS multiplies a 16 x 32 bf16 tile by a 32 x 16 one (8192 multiply-adds)
// at a throughput of one per 16 cycles, 16 times what AVX-512 FMAs do. PyTorch reaches AMX only
// through oneDNN's bf16 matmul, which would round the weights and activations to bf16.
//
// Numerics: the checkpoint's values exactly, fp32 accumulation, no bf16 rounding anywhere.
//   * A block's weights are d q_j + m with q_j a 4-bit (Q4_0: q_j - 8; Q8_0: 8-bit) integer, and
//     every such integer is a bf16 value. So sum_j (d q_j + m) x_j = d (sum_j q_j x_j) + m sum_j x_j,
//     and the tiles multiply the integers q_j, exactly.
//   * Every fp32 activation is the sum of three bf16 values (hi = x truncated to bf16, mid = the
//     remainder truncated, lo = what is left: 8 + 8 + 8 significant bits). q_j times each part
//     is exact in fp32, so three tile products give sum_j q_j x_j in fp32 arithmetic.
//   * Per block and output: c = (c_hi + c_mid) + c_lo, then acc += d c, then acc += m s with
//     s = sum_j x_j (in order). Blocks go in order.
// Each output's arithmetic depends only on its own activation row and weight row, never on
// the batch: a row's result is bit-identical whichever rows it is computed with (speculative
// verification stays exact). It differs from the AVX path only in rounding order.
//
// Layout: weights are the GGUF blocks as stored. A task takes 64 weight rows and one 16-row tile
// of activations and walks the blocks in order: per block, the activation parts stay in three
// tiles while each 16 weight rows' integers are expanded to a bf16 tile, multiplied, and the
// 16 x 16 product scaled into the accumulators.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__) && defined(__AVX512BW__) && \
    defined(__linux__)
#define FM_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#else
#define FM_AMX 0
#endif

namespace {

#if FM_AMX
constexpr int64_t kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 8;
constexpr int kT = 16;  // tile edge: 16 weight rows x 16 activation rows, 32 k (one block) per product

// Linux grants the 8 KB of tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM), once
// per process, for every thread.
bool request_tile_state() {
  constexpr long kReqXcompPerm = 0x1023, kXfeatureTileData = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureTileData) == 0;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0: weights (16 rows x 32 bf16), 1-3: activation parts (16 k-pairs x 16 rows, VNNI),
// 4-6: products per part (16 x 16 fp32). All 16 rows of 64 bytes.
TileConfig make_config() {
  TileConfig c;
  for (int t = 0; t < 7; ++t) {
    c.colsb[t] = 64;
    c.rows[t] = 16;
  }
  return c;
}

inline uint32_t f32_bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u;
}
inline float bits_f32(uint32_t u) {
  float v;
  std::memcpy(&v, &u, 4);
  return v;
}

// x rows -> per 16-row tile t and block b: three bf16 VNNI tiles (pair r = k/2 holds k = 2r, 2r+1
// for each of 16 rows; rows past M are zero) and the block sums s, in order over k.
void prepare_activations(const float* x, int64_t M, int64_t K, std::vector<uint16_t>& parts,
                         std::vector<float>& sums) {
  const int64_t nb = K / 32, MT = (M + kT - 1) / kT;
  parts.assign(MT * nb * 3 * 512, 0);
  sums.assign(MT * nb * kT, 0.0f);
  at::parallel_for(0, MT * nb, 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / nb, b = i % nb;
      uint16_t* p = parts.data() + i * 3 * 512;
      float* s = sums.data() + i * kT;
      for (int m = 0; m < kT; ++m) {
        const int64_t row = t * kT + m;
        if (row >= M) break;
        const float* xb = x + row * K + b * 32;
        float sum = 0.0f;
        for (int k = 0; k < 32; ++k) {
          const float v = xb[k];
          sum += v;
          const uint32_t hi = f32_bits(v) & 0xFFFF0000u;
          const float r1 = v - bits_f32(hi);  // exact
          const uint32_t mid = f32_bits(r1) & 0xFFFF0000u;
          const float r2 = r1 - bits_f32(mid);  // exact, at most 8 significant bits: a bf16 value
          const int64_t at = (k / 2) * 32 + m * 2 + (k % 2);
          p[at] = static_cast<uint16_t>(hi >> 16);
          p[512 + at] = static_cast<uint16_t>(mid >> 16);
          p[1024 + at] = static_cast<uint16_t>(f32_bits(r2) >> 16);
        }
        s[m] = sum;
      }
    }
  });
}

// Block b of 16 weight rows (w points at the first row's block, rows row_bytes apart) -> its
// integers as a bf16 tile (16 x 32), and the rows' scales d and minimums m (m = 0 where the
// format has none).
template <int QT>
inline void prepare_block(const uint8_t* w, int64_t row_bytes, uint16_t* a, float* d, float* mn) {
  // bf16 bit patterns of the 4-bit integers (Q4_1: 0..15; Q4_0: -8..7), indexed by nibble.
  alignas(64) static const uint16_t kQ4_1Table[32] = {0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0,
                                                       0x40E0, 0x4100, 0x4110, 0x4120, 0x4130, 0x4140, 0x4150,
                                                       0x4160, 0x4170};
  alignas(64) static const uint16_t kQ4_0Table[32] = {0xC100, 0xC0E0, 0xC0C0, 0xC0A0, 0xC080, 0xC040, 0xC000,
                                                       0xBF80, 0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0,
                                                       0x40C0, 0x40E0};
  const __m512i table = _mm512_load_si512(QT == kQ4_1 ? kQ4_1Table : kQ4_0Table);
  for (int n = 0; n < kT; ++n) {
    const uint8_t* blk = w + n * row_bytes;
    uint16_t* out = a + n * 32;
    if constexpr (QT == kQ8_0) {
      d[n] = _cvtsh_ss(*reinterpret_cast<const uint16_t*>(blk));
      mn[n] = 0.0f;
      const __m512i q = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2)));
      // int16 -> fp32 -> bf16 bits, exact for |q| <= 128 (two halves of 16)
      const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_castsi512_si256(q)));
      const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(q, 1)));
      _mm256_store_si256(reinterpret_cast<__m256i*>(out), _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(lo), 16)));
      _mm256_store_si256(reinterpret_cast<__m256i*>(out + 16), _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(hi), 16)));
    } else {
      const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128(*reinterpret_cast<const int32_t*>(blk)));
      d[n] = _mm_cvtss_f32(dm);
      mn[n] = QT == kQ4_1 ? _mm_cvtss_f32(_mm_movehdup_ps(dm)) : 0.0f;
      const uint8_t* qs = blk + (QT == kQ4_1 ? 4 : 2);
      // byte j holds weights j (low nibble) and j + 16 (high): 16 words of bytes, split, looked up
      const __m256i bytes = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
      const __m512i idx = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(bytes, _mm256_set1_epi16(0x0F))),
                                             _mm256_srli_epi16(bytes, 4), 1);
      _mm512_store_si512(out, _mm512_permutexvar_epi16(idx, table));
    }
  }
}

// Tiles: 1-3 hold one block of the activation parts, reused for every 16 weight rows; 0 and 5
// hold two weight tiles, 4 and 6 their products, so two independent chains are in flight.
constexpr int kGroup = 4;  // n-tiles per task step: 64 weight rows, cached while the blocks go by

template <int QT>
void matmul_amx_t(const float* xp, int64_t M, int64_t K, const uint8_t* wp, int64_t N, int64_t row_bytes, float* op) {
  constexpr int64_t BB = QT == kQ4_0 ? 18 : QT == kQ4_1 ? 20 : 34;
  const int64_t nb = K / 32, MT = (M + kT - 1) / kT, NT = N / kT, NG = (NT + kGroup - 1) / kGroup;
  std::vector<uint16_t> parts;
  std::vector<float> sums;
  prepare_activations(xp, M, K, parts, sums);
  static const TileConfig config = make_config();
  at::parallel_for(0, MT * NG, 1, [&](int64_t i0, int64_t i1) {
    _tile_loadconfig(&config);  // per thread: the tile configuration is thread state
    alignas(64) uint16_t a[2][kT * 32];
    alignas(64) float c[2][kT * kT];
    alignas(64) float acc[kGroup][kT * kT];  // [n-tile][n][m]
    alignas(64) float d[2][kT], mn[2][kT];
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t mt = i / NG, g0 = (i % NG) * kGroup, g1 = std::min(NT, g0 + kGroup);
      std::memset(acc, 0, sizeof(acc));
      // The group's rows are one contiguous run of bytes, read block column by block column:
      // fetch the next group's run a slice per block, so it is in cache when its turn comes.
      const char* next = reinterpret_cast<const char*>(wp + g1 * kT * row_bytes);
      const int64_t next_bytes = g1 < NT ? std::min(NT - g1, int64_t{kGroup}) * kT * row_bytes : 0;
      const int64_t slice = (next_bytes / nb + 63) / 64 * 64;
      for (int64_t b = 0; b < nb; ++b) {
        for (int64_t off = b * slice; off < std::min(next_bytes, (b + 1) * slice); off += 64)
          _mm_prefetch(next + off, _MM_HINT_T0);
        const uint16_t* p = parts.data() + (mt * nb + b) * 3 * 512;
        _tile_loadd(1, p, 64);
        _tile_loadd(2, p + 512, 64);
        _tile_loadd(3, p + 1024, 64);
        const __m512 s = _mm512_loadu_ps(sums.data() + (mt * nb + b) * kT);
        for (int64_t nt = g0; nt < g1; nt += 2) {
          const bool two = nt + 1 < g1;
          prepare_block<QT>(wp + nt * kT * row_bytes + b * BB, row_bytes, a[0], d[0], mn[0]);
          _tile_loadd(0, a[0], 64);
          _tile_zero(4);
          _tile_dpbf16ps(4, 0, 1);
          if (two) {
            prepare_block<QT>(wp + (nt + 1) * kT * row_bytes + b * BB, row_bytes, a[1], d[1], mn[1]);
            _tile_loadd(5, a[1], 64);
            _tile_zero(6);
            _tile_dpbf16ps(6, 5, 1);
          }
          _tile_dpbf16ps(4, 0, 2);
          if (two) _tile_dpbf16ps(6, 5, 2);
          _tile_dpbf16ps(4, 0, 3);
          if (two) _tile_dpbf16ps(6, 5, 3);
          _tile_stored(4, c[0], 64);
          if (two) _tile_stored(6, c[1], 64);
          for (int u = 0; u < (two ? 2 : 1); ++u) {
            float* ac = acc[nt - g0 + u];
            for (int n = 0; n < kT; ++n) {
              __m512 v = _mm512_fmadd_ps(_mm512_load_ps(c[u] + n * kT), _mm512_set1_ps(d[u][n]), _mm512_load_ps(ac + n * kT));
              if constexpr (QT == kQ4_1) v = _mm512_fmadd_ps(s, _mm512_set1_ps(mn[u][n]), v);
              _mm512_store_ps(ac + n * kT, v);
            }
          }
        }
      }
      // acc[t][n][m]: output column n of the group's tile t for 16 activation rows -> rows of out
      const int64_t rows = std::min<int64_t>(kT, M - mt * kT);
      for (int64_t m = 0; m < rows; ++m) {
        float* o = op + (mt * kT + m) * N;
        for (int64_t nt = g0; nt < g1; ++nt)
          for (int n = 0; n < kT; ++n) o[nt * kT + n] = acc[nt - g0][n * kT + m];
      }
    }
    _tile_release();
  });
}
#endif

}  // namespace

// Whether this build has the AMX path and the OS granted the tile state ("" if usable, else why not).
std::string amx_unavailable_reason() {
#if FM_AMX
  static const bool granted = request_tile_state();
  return granted ? "" : "the OS refused the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM)";
#else
  return "not built with AMX (the CPU lacks AMX-BF16, or FASTMODE_KERNELS_ISA limits the build)";
#endif
}

// Activation rows one tile pass computes where AMX runs (0 where it does not): a step of 9-16
// rows costs one pass, 17-32 two, so the planner prices large steps in whole tiles.
int64_t amx_tile_rows() {
#if FM_AMX
  return amx_unavailable_reason().empty() ? kT : 0;
#else
  return 0;
#endif
}

// out (M, N) = x (M, K) times the GGUF-block weight (N rows) on AMX; false where this path does
// not apply (no AMX, N not a multiple of 16), and the caller uses the AVX path.
bool amx_matmul(const float* xp, int64_t M, int64_t K, const uint8_t* wp, int64_t N, int64_t row_bytes, int64_t qtype,
                float* op) {
#if FM_AMX
  if (N % kT != 0 || !amx_unavailable_reason().empty()) return false;
  if (qtype == kQ4_1) matmul_amx_t<kQ4_1>(xp, M, K, wp, N, row_bytes, op);
  else if (qtype == kQ4_0) matmul_amx_t<kQ4_0>(xp, M, K, wp, N, row_bytes, op);
  else if (qtype == kQ8_0) matmul_amx_t<kQ8_0>(xp, M, K, wp, N, row_bytes, op);
  else return false;
  return true;
#else
  (void)xp, (void)M, (void)K, (void)wp, (void)N, (void)row_bytes, (void)qtype, (void)op;
  return false;
#endif
}
