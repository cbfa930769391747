// Small fused CPU ops for the decode step, where PyTorch's eager overhead
// (one dispatch, one allocation per elementwise op, a gathered copy of every
// sequence's KV blocks per layer) costs more than the arithmetic.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

// Attention for one new query token per sequence over a paged KV cache.
// q: (B, H, D); k_cache, v_cache: (num_blocks, block_size, KVH, D);
// block_tables: (B, max_blocks) long; context_lens: (B,) long. Returns (B, H, D).
// Reads each sequence's blocks in place (no gathered copy); fp32 throughout.
torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                     torch::Tensor block_tables, torch::Tensor context_lens, double scale) {
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == torch::kFloat, "paged_decode_attention: q must be (B, H, D) fp32");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.scalar_type() == torch::kFloat && k_cache.is_contiguous() &&
                  v_cache.sizes() == k_cache.sizes() && v_cache.is_contiguous(),
              "paged_decode_attention: caches must be contiguous (blocks, block_size, kv_heads, D) fp32");
  q = q.contiguous();
  auto tables = block_tables.to(torch::kLong).contiguous();
  auto lens = context_lens.to(torch::kLong).contiguous();
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t bs = k_cache.size(1), KVH = k_cache.size(2), nblocks = k_cache.size(0);
  TORCH_CHECK(k_cache.size(3) == D && H % KVH == 0, "paged_decode_attention: head shapes do not match");
  TORCH_CHECK(tables.size(0) == B && lens.size(0) == B, "paged_decode_attention: one table and length per sequence");
  const int64_t maxb = tables.size(1), G = H / KVH;
  const int64_t* tp = tables.data_ptr<int64_t>();
  const int64_t* lp = lens.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(lp[b] >= 1 && lp[b] <= maxb * bs, "paged_decode_attention: context length ", lp[b], " out of range");
    for (int64_t j = 0; j < (lp[b] + bs - 1) / bs; ++j)
      TORCH_CHECK(tp[b * maxb + j] >= 0 && tp[b * maxb + j] < nblocks, "paged_decode_attention: bad block id");
  }
  auto out = torch::empty_like(q);
  const float* qp = q.data_ptr<float>();
  const float* kp = k_cache.data_ptr<float>();
  const float* vp = v_cache.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  at::parallel_for(0, B * KVH, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> scores;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / KVH, kh = i % KVH, T = lp[b];
      scores.resize(G * T);
      // scores[g, t] = q[b, kh*G+g] . k[t]
      for (int64_t t = 0; t < T; ++t) {
        const float* k = kp + ((tp[b * maxb + t / bs] * bs + t % bs) * KVH + kh) * D;
        for (int64_t g = 0; g < G; ++g) {
          const float* qv = qp + (b * H + kh * G + g) * D;
          float s = 0.0f;
#pragma omp simd reduction(+ : s)
          for (int64_t d = 0; d < D; ++d) s += qv[d] * k[d];
          scores[g * T + t] = s * sc;
        }
      }
      for (int64_t g = 0; g < G; ++g) {
        float* sg = scores.data() + g * T;
        float mx = -std::numeric_limits<float>::infinity(), den = 0.0f;
        for (int64_t t = 0; t < T; ++t) mx = std::max(mx, sg[t]);
        for (int64_t t = 0; t < T; ++t) {
          sg[t] = std::exp(sg[t] - mx);
          den += sg[t];
        }
        const float inv = 1.0f / den;
        for (int64_t t = 0; t < T; ++t) sg[t] *= inv;
      }
      for (int64_t g = 0; g < G; ++g) std::fill_n(op + (b * H + kh * G + g) * D, D, 0.0f);
      for (int64_t t = 0; t < T; ++t) {
        const float* v = vp + ((tp[b * maxb + t / bs] * bs + t % bs) * KVH + kh) * D;
        for (int64_t g = 0; g < G; ++g) {
          float* o = op + (b * H + kh * G + g) * D;
          const float p = scores[g * T + t];
          for (int64_t d = 0; d < D; ++d) o[d] += p * v[d];
        }
      }
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
      float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
      for (int64_t d = 0; d < D; ++d) ss += xr[d] * xr[d];
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
      for (int64_t d = 0; d < D; ++d) op[r * D + d] = g[d] / (1.0f + std::exp(-g[d])) * u[d];
    }
  });
  return out;
}
