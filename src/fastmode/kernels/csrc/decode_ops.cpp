// Small fused CPU ops for the decode step, where PyTorch's eager overhead
// (one dispatch, one allocation per elementwise op, a gathered copy of every
// sequence's KV blocks per layer) costs more than the arithmetic.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace {

// n fp16 values -> fp32 (exact: every fp16 value is an fp32 value).
inline void half_to_float_row(const at::Half* src, float* dst, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
#endif
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

// a . b over n floats.
inline float dot(const float* a, const float* b, int64_t n) {
  int64_t i = 0;
  float s = 0.0f;
#if defined(__AVX2__) && defined(__FMA__)
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  __m256 v = _mm256_add_ps(acc0, acc1);
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  s = _mm_cvtss_f32(h);
#endif
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

#if defined(__AVX2__) && defined(__FMA__)
// e^x for 8 floats, x <= 0 (softmax after the max is subtracted): 2^n * P(r),
// n = round(x / ln 2), r = x - n ln 2 in two parts, P a degree-6 Taylor
// polynomial (relative error < 2e-7 on |r| <= ln2/2). Inputs below -87 give 0.
inline __m256 exp_neg(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-06f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
#endif

// x[i] = e^(x[i] - mx) over n floats; returns their sum.
inline float exp_shift_sum(float* x, int64_t n, float mx) {
  int64_t i = 0;
  float sum = 0.0f;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 m = _mm256_set1_ps(mx);
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp_neg(_mm256_sub_ps(_mm256_loadu_ps(x + i), m));
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, acc);
  for (float l : lanes) sum += l;
#endif
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  return sum;
}

// y += p * x over n floats.
inline void axpy(float p, const float* x, float* y, int64_t n) {
  int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 pv = _mm256_set1_ps(p);
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(pv, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
#endif
  for (; i < n; ++i) y[i] += p * x[i];
}


#if defined(__AVX2__) && defined(__FMA__)
// Four scores at once: out[i] = q . k_i over D floats (D % 8 == 0). One
// accumulator per key, reduced together with horizontal adds.
inline void dot4(const float* q, const float* k0, const float* k1, const float* k2, const float* k3, int64_t D,
                 float* out) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t d = 0; d < D; d += 8) {
    const __m256 qv = _mm256_loadu_ps(q + d);
    a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + d), a0);
    a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + d), a1);
    a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + d), a2);
    a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + d), a3);
  }
  const __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1)));
}

// out[g][d0 .. d0+16) = sum_t p[g * ldp + t] v_t[d0 .. d0+16) for GT query heads,
// accumulating in registers; v_t is row t of the sequence's paged V.
template <int GT>
inline void weighted_sum16(const float* p, int64_t ldp, const float* const* vrows, int64_t T, int64_t d0, float* out,
                           int64_t ldo) {
  __m256 acc[GT][2];
  for (int g = 0; g < GT; ++g) acc[g][0] = acc[g][1] = _mm256_setzero_ps();
  for (int64_t t = 0; t < T; ++t) {
    const __m256 v0 = _mm256_loadu_ps(vrows[t] + d0), v1 = _mm256_loadu_ps(vrows[t] + d0 + 8);
    for (int g = 0; g < GT; ++g) {
      const __m256 w = _mm256_broadcast_ss(p + g * ldp + t);
      acc[g][0] = _mm256_fmadd_ps(w, v0, acc[g][0]);
      acc[g][1] = _mm256_fmadd_ps(w, v1, acc[g][1]);
    }
  }
  for (int g = 0; g < GT; ++g) {
    _mm256_storeu_ps(out + g * ldo + d0, acc[g][0]);
    _mm256_storeu_ps(out + g * ldo + d0 + 8, acc[g][1]);
  }
}
#endif

}  // namespace

// Attention for one new query token per sequence over a paged KV cache.
// q: (B, H, D); k_cache, v_cache: (num_blocks, block_size, KVH, D), both fp32
// or both fp16; block_tables: (B, max_blocks) long; context_lens: (B,) long.
// Returns (B, H, D), fp32 arithmetic throughout.
//
// Split by context (as flash-decoding does): a task takes kChunk consecutive
// tokens of one sequence, every head, and keeps per query head the chunk's
// largest score, its sum of exponentials and its unnormalised weighted sum of
// V; a second pass merges each sequence's chunks in order. The split depends
// on the context length only, never on the batch, so a row's result does not
// depend on what else is in the step, and one long sequence still keeps every
// thread busy. A token's row holds all its KV heads side by side: fp16 rows
// (half the bytes; at 16 sequences a step reads more KV than weight bytes) are
// widened whole into a scratch buffer, contiguous reads the hardware
// prefetcher follows; fp32 rows are read in place.
torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                     torch::Tensor block_tables, torch::Tensor context_lens, double scale) {
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == torch::kFloat, "paged_decode_attention: q must be (B, H, D) fp32");
  const bool half = k_cache.scalar_type() == torch::kHalf;
  TORCH_CHECK(k_cache.dim() == 4 && (half || k_cache.scalar_type() == torch::kFloat) && k_cache.is_contiguous() &&
                  v_cache.sizes() == k_cache.sizes() && v_cache.scalar_type() == k_cache.scalar_type() &&
                  v_cache.is_contiguous(),
              "paged_decode_attention: caches must be contiguous (blocks, block_size, kv_heads, D), both fp32 or both fp16");
  q = q.contiguous();
  auto tables = block_tables.to(torch::kLong).contiguous();
  auto lens = context_lens.to(torch::kLong).contiguous();
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t bs = k_cache.size(1), KVH = k_cache.size(2), nblocks = k_cache.size(0);
  TORCH_CHECK(k_cache.size(3) == D && H % KVH == 0, "paged_decode_attention: head shapes do not match");
  TORCH_CHECK(tables.size(0) == B && lens.size(0) == B, "paged_decode_attention: one table and length per sequence");
  const int64_t maxb = tables.size(1), G = H / KVH, W = KVH * D;
  const int64_t* tp = tables.data_ptr<int64_t>();
  const int64_t* lp = lens.data_ptr<int64_t>();
  constexpr int64_t kChunk = 32;
  std::vector<int64_t> first(B + 1, 0);  // first chunk task of sequence b
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(lp[b] >= 1 && lp[b] <= maxb * bs, "paged_decode_attention: context length ", lp[b], " out of range");
    for (int64_t j = 0; j < (lp[b] + bs - 1) / bs; ++j)
      TORCH_CHECK(tp[b * maxb + j] >= 0 && tp[b * maxb + j] < nblocks, "paged_decode_attention: bad block id");
    first[b + 1] = first[b] + (lp[b] + kChunk - 1) / kChunk;
  }
  auto out = torch::empty_like(q);
  if (B == 0) return out;
  const float* qp = q.data_ptr<float>();
  const float* kp = half ? nullptr : k_cache.data_ptr<float>();
  const float* vp = half ? nullptr : v_cache.data_ptr<float>();
  const at::Half* kh16 = half ? k_cache.data_ptr<at::Half>() : nullptr;
  const at::Half* vh16 = half ? v_cache.data_ptr<at::Half>() : nullptr;
  float* op = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);
#if defined(__AVX2__) && defined(__FMA__)
  const bool simd = D % 16 == 0;
#else
  const bool simd = false;
#endif
  const int64_t ntasks = first[B];
  // Per chunk and query head, every entry written by its task (no zero-fill: at 64 sequences x
  // 1000 tokens the partial sums are ~5 MB a layer).
  std::unique_ptr<float[]> pmax(new float[ntasks * H]), psum(new float[ntasks * H]), pacc(new float[ntasks * H * D]);
  at::parallel_for(0, ntasks, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> scores(G * kChunk), wide(half ? 2 * kChunk * W : 0);
    std::vector<const float*> krows(kChunk), vrows(kChunk);
    int64_t base[kChunk];
    int64_t b = std::upper_bound(first.begin(), first.end(), i0) - first.begin() - 1;
    for (int64_t i = i0; i < i1; ++i) {
      while (first[b + 1] <= i) ++b;
      const int64_t t0 = (i - first[b]) * kChunk, n = std::min(kChunk, lp[b] - t0);
      for (int64_t r = 0; r < n; ++r) {
        const int64_t t = t0 + r;
        base[r] = (tp[b * maxb + t / bs] * bs + t % bs) * W;  // the token's row: every KV head
      }
      float* kw = wide.data();
      float* vw = kw + kChunk * W;
      if (half) {
        for (int64_t r = 0; r < n; ++r) {
#if defined(__AVX2__)
          if (r + 2 < n)  // rows are contiguous within a block only: ask for the next-but-one row too
            for (int64_t l = 0; l < W; l += 32) {
              _mm_prefetch(reinterpret_cast<const char*>(kh16 + base[r + 2] + l), _MM_HINT_T0);
              _mm_prefetch(reinterpret_cast<const char*>(vh16 + base[r + 2] + l), _MM_HINT_T0);
            }
#endif
          half_to_float_row(kh16 + base[r], kw + r * W, W);
          half_to_float_row(vh16 + base[r], vw + r * W, W);
        }
      }
      for (int64_t kh = 0; kh < KVH; ++kh) {
        for (int64_t r = 0; r < n; ++r) {
          krows[r] = half ? kw + r * W + kh * D : kp + base[r] + kh * D;
          vrows[r] = half ? vw + r * W + kh * D : vp + base[r] + kh * D;
        }
        const float* qh = qp + (b * H + kh * G) * D;  // the G query heads that share this KV head
        const int64_t h0 = i * H + kh * G;
        // scores[g, t] = q_g . k_t * scale; e^(score - chunk max), summed
        for (int64_t g = 0; g < G; ++g) {
          float* sg = scores.data() + g * n;
          int64_t t = 0;
#if defined(__AVX2__) && defined(__FMA__)
          for (; simd && t + 4 <= n; t += 4) dot4(qh + g * D, krows[t], krows[t + 1], krows[t + 2], krows[t + 3], D, sg + t);
#endif
          for (; t < n; ++t) sg[t] = dot(qh + g * D, krows[t], D);
          float mx = -std::numeric_limits<float>::infinity();
          for (t = 0; t < n; ++t) mx = std::max(mx, sg[t] *= sc);
          pmax[h0 + g] = mx;
          psum[h0 + g] = exp_shift_sum(sg, n, mx);
        }
        // acc_g = sum_t e_g[t] v_t, unnormalised
        float* acc = pacc.get() + h0 * D;
        if (!simd) {
          std::fill_n(acc, G * D, 0.0f);
          for (int64_t t = 0; t < n; ++t)
            for (int64_t g = 0; g < G; ++g) axpy(scores[g * n + t], vrows[t], acc + g * D, D);
          continue;
        }
#if defined(__AVX2__) && defined(__FMA__)
        for (int64_t g = 0; g < G; g += 6) {  // six heads x 16 values: 12 accumulators in registers
          const int64_t gt = std::min<int64_t>(6, G - g);
          const float* pg = scores.data() + g * n;
          float* og = acc + g * D;
          for (int64_t d0 = 0; d0 < D; d0 += 16) {
            switch (gt) {
              case 1: weighted_sum16<1>(pg, n, vrows.data(), n, d0, og, D); break;
              case 2: weighted_sum16<2>(pg, n, vrows.data(), n, d0, og, D); break;
              case 3: weighted_sum16<3>(pg, n, vrows.data(), n, d0, og, D); break;
              case 4: weighted_sum16<4>(pg, n, vrows.data(), n, d0, og, D); break;
              case 5: weighted_sum16<5>(pg, n, vrows.data(), n, d0, og, D); break;
              default: weighted_sum16<6>(pg, n, vrows.data(), n, d0, og, D); break;
            }
          }
        }
#endif
      }
    }
  });
  // Merge each (sequence, head)'s chunks in order: rescale to the overall max, sum, normalise.
  at::parallel_for(0, B * H, 16, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) {
      const int64_t b = j / H, h = j % H;
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t c = first[b]; c < first[b + 1]; ++c) mx = std::max(mx, pmax[c * H + h]);
      float* o = op + j * D;
      std::fill_n(o, D, 0.0f);
      float total = 0.0f;
      for (int64_t c = first[b]; c < first[b + 1]; ++c) {
        const float w = std::exp(pmax[c * H + h] - mx);
        total += w * psum[c * H + h];
        axpy(w, pacc.get() + (c * H + h) * D, o, D);
      }
      const float inv = 1.0f / total;
      for (int64_t d = 0; d < D; ++d) o[d] *= inv;
    }
  });
  return out;
}

// RMSNorm over the last dimension: y = x / sqrt(mean(x^2) + eps) * w, fp32.
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor w, double eps) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat && w.scalar_type() == torch::kFloat, "rms_norm: fp32 only");
  x = x.contiguous();
  const int64_t D = x.size(-1), R = D ? x.numel() / D : 0;
  TORCH_CHECK(w.numel() == D, "rms_norm: weight has ", w.numel(), " values for rows of ", D);
  auto out = torch::empty_like(x);
  auto wc = w.contiguous();
  const float* xp = x.data_ptr<float>();
  const float* wp = wc.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, R, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = xp + r * D;
      const float ss = dot(xr, xr, D);
      const float inv = 1.0f / std::sqrt(ss / D + static_cast<float>(eps));
      for (int64_t d = 0; d < D; ++d) op[r * D + d] = wp[d] * (xr[d] * inv);
    }
  });
  return out;
}

// SwiGLU: x = [gate | up] along the last dimension -> silu(gate) * up.
torch::Tensor silu_mul(torch::Tensor x) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat && x.size(-1) % 2 == 0, "silu_mul: fp32 with an even last dimension");
  x = x.contiguous();
  const int64_t D2 = x.size(-1), D = D2 / 2, R = D2 ? x.numel() / D2 : 0;
  auto sizes = x.sizes().vec();
  sizes.back() = D;
  auto out = torch::empty(sizes, x.options());
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, R, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* g = xp + r * D2;
      const float* u = g + D;
      int64_t d = 0;
#if defined(__AVX2__) && defined(__FMA__)
      // sigmoid(g) from e = e^-|g| (so the exponent never overflows): 1/(1+e) for g >= 0, e/(1+e) below.
      const __m256 one = _mm256_set1_ps(1.0f), neg = _mm256_set1_ps(-0.0f);
      for (; d + 8 <= D; d += 8) {
        const __m256 gv = _mm256_loadu_ps(g + d);
        const __m256 e = exp_neg(_mm256_or_ps(gv, neg));
        const __m256 sig = _mm256_div_ps(_mm256_blendv_ps(one, e, gv), _mm256_add_ps(one, e));
        _mm256_storeu_ps(op + r * D + d, _mm256_mul_ps(_mm256_mul_ps(gv, sig), _mm256_loadu_ps(u + d)));
      }
#endif
      for (; d < D; ++d) op[r * D + d] = g[d] / (1.0f + std::exp(-g[d])) * u[d];
    }
  });
  return out;
}
