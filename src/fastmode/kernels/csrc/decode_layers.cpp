// The decoder layers of a pure-decode step (one new token per sequence) in one
// call: RMSNorm -> q/k/v -> RoPE + KV write -> paged attention -> o_proj ->
// residual -> RMSNorm -> gate/up -> SwiGLU -> down -> residual, for every
// layer, with no Python between ops. It is composed of the same functions the
// per-op path calls from Python, so a token gets the same result either way.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#if defined(__F16C__)
#include <immintrin.h>
#endif

torch::Tensor quant_matmul(torch::Tensor x, torch::Tensor w, int64_t qtype, bool int8_activations);
torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                     torch::Tensor block_tables, torch::Tensor context_lens, double scale);
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor w, double eps);
torch::Tensor silu_mul(torch::Tensor x);

namespace {

// n fp32 values into a cache row: copied, or rounded to fp16 (nearest even, as torch's
// .to(torch.float16) rounds).
inline void store_row(const float* src, float* dst, int64_t n) { std::copy_n(src, n, dst); }
inline void store_row(const float* src, at::Half* dst, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
  for (; i < n; ++i) dst[i] = static_cast<at::Half>(src[i]);
}

template <typename T>
void rope_qkv_into(const float* xp, const float* cp, const float* snp, int64_t N, int64_t H, int64_t KVH, int64_t D,
                   const int64_t* sp, float* qp, T* kc, T* vc) {
  const int64_t half = D / 2, row = (H + 2 * KVH) * D;
  auto rotate = [&](const float* in, float* out, const float* cs, const float* sn) {
    for (int64_t j = 0; j < half; ++j) {
      const float x1 = in[j], x2 = in[j + half];
      out[j] = x1 * cs[j] - x2 * sn[j];
      out[j + half] = x2 * cs[j] + x1 * sn[j];
    }
  };
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    std::vector<float> k(D);
    for (int64_t n = n0; n < n1; ++n) {
      const float* in = xp + n * row;
      const float* cs = cp + n * half;
      const float* sn = snp + n * half;
      for (int64_t h = 0; h < H; ++h) rotate(in + h * D, qp + (n * H + h) * D, cs, sn);
      for (int64_t h = 0; h < KVH; ++h) {
        rotate(in + (H + h) * D, k.data(), cs, sn);
        store_row(k.data(), kc + (sp[n] * KVH + h) * D, D);
        store_row(in + (H + KVH + h) * D, vc + (sp[n] * KVH + h) * D, D);
      }
    }
  });
}

}  // namespace

// Rotate-half RoPE on the q and k parts of a fused qkv row, writing k and v
// into their cache slots. qkv: (N, (H + 2 KVH) D); cos, sin: (N, D/2);
// slots: (N,) long; caches: (num_blocks, block_size, KVH, D), fp32 or fp16
// (k and v rounded to nearest). Returns q, (N, H, D).
torch::Tensor rope_qkv(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, int64_t heads, int64_t kv_heads,
                       int64_t head_dim, torch::Tensor slots, torch::Tensor k_cache, torch::Tensor v_cache) {
  const int64_t N = qkv.size(0), D = head_dim, half = D / 2, H = heads, KVH = kv_heads;
  TORCH_CHECK(qkv.dim() == 2 && qkv.scalar_type() == torch::kFloat && qkv.size(1) == (H + 2 * KVH) * D,
              "rope_qkv: qkv must be (N, (heads + 2 kv_heads) head_dim) fp32");
  TORCH_CHECK(D % 2 == 0 && cos.numel() == N * half && sin.numel() == N * half, "rope_qkv: cos/sin must be (N, D/2)");
  const auto ct = k_cache.scalar_type();
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && (ct == torch::kFloat || ct == torch::kHalf) &&
                  v_cache.scalar_type() == ct && k_cache.size(2) == KVH && k_cache.size(3) == D &&
                  v_cache.sizes() == k_cache.sizes(),
              "rope_qkv: caches must be contiguous (blocks, block_size, kv_heads, head_dim), both fp32 or both fp16");
  auto slot = slots.to(torch::kLong).contiguous();
  TORCH_CHECK(slot.numel() == N, "rope_qkv: one slot per token");
  const int64_t* sp = slot.data_ptr<int64_t>();
  const int64_t capacity = k_cache.size(0) * k_cache.size(1);
  for (int64_t i = 0; i < N; ++i) TORCH_CHECK(sp[i] >= 0 && sp[i] < capacity, "rope_qkv: slot ", sp[i], " out of range");
  qkv = qkv.contiguous();
  auto c = cos.contiguous(), s = sin.contiguous();
  auto q = torch::empty({N, H, D}, qkv.options());
  if (ct == torch::kHalf)
    rope_qkv_into(qkv.data_ptr<float>(), c.data_ptr<float>(), s.data_ptr<float>(), N, H, KVH, D, sp,
                  q.data_ptr<float>(), k_cache.data_ptr<at::Half>(), v_cache.data_ptr<at::Half>());
  else
    rope_qkv_into(qkv.data_ptr<float>(), c.data_ptr<float>(), s.data_ptr<float>(), N, H, KVH, D, sp,
                  q.data_ptr<float>(), k_cache.data_ptr<float>(), v_cache.data_ptr<float>());
  return q;
}

// x: (B, hidden). Per layer i: norms[2i], norms[2i+1] (input, post-attention); then its four
// linears in order, qkv, o, gate_up, down. Linear j is parts[j] consecutive entries of `weights`
// (blocks) and `qtypes`: one where its rows are one block matrix, more where its output rows come
// in parts stored in different formats (a Q4_K_M file's q/k beside a Q6_K or Q8_0 v). The parts'
// outputs are concatenated in order, as the per-op path's StackedLinear does.
torch::Tensor decode_layers(torch::Tensor x, std::vector<torch::Tensor> norms, std::vector<torch::Tensor> weights,
                            std::vector<int64_t> qtypes, std::vector<int64_t> parts,
                            std::vector<torch::Tensor> k_caches, std::vector<torch::Tensor> v_caches,
                            torch::Tensor cos, torch::Tensor sin, torch::Tensor slots, torch::Tensor block_tables,
                            torch::Tensor context_lens, int64_t heads, int64_t kv_heads, int64_t head_dim, double eps,
                            double scale, bool int8_activations) {
  const size_t L = k_caches.size();
  TORCH_CHECK(norms.size() == 2 * L && parts.size() == 4 * L && v_caches.size() == L,
              "decode_layers: 2 norms, 4 linears and one K/V cache pair per layer");
  std::vector<size_t> first(4 * L + 1, 0);  // linear j's parts are weights[first[j] .. first[j + 1])
  for (size_t j = 0; j < 4 * L; ++j) {
    TORCH_CHECK(parts[j] >= 1, "decode_layers: every linear has at least one part");
    first[j + 1] = first[j] + static_cast<size_t>(parts[j]);
  }
  TORCH_CHECK(weights.size() == first[4 * L] && qtypes.size() == weights.size(),
              "decode_layers: one weight and one ggml type per linear part");
  auto linear = [&](const torch::Tensor& in, size_t j) {
    if (first[j + 1] - first[j] == 1) return quant_matmul(in, weights[first[j]], qtypes[first[j]], int8_activations);
    std::vector<torch::Tensor> out;
    for (size_t p = first[j]; p < first[j + 1]; ++p)
      out.push_back(quant_matmul(in, weights[p], qtypes[p], int8_activations));
    return torch::cat(out, 1);
  };
  const int64_t B = x.size(0);
  for (size_t i = 0; i < L; ++i) {
    auto h = rms_norm(x, norms[2 * i], eps);
    auto qkv = linear(h, 4 * i);
    auto q = rope_qkv(qkv, cos, sin, heads, kv_heads, head_dim, slots, k_caches[i], v_caches[i]);
    auto a = paged_decode_attention(q, k_caches[i], v_caches[i], block_tables, context_lens, scale);
    x = x + linear(a.view({B, heads * head_dim}), 4 * i + 1);
    h = rms_norm(x, norms[2 * i + 1], eps);
    auto gu = linear(h, 4 * i + 2);
    x = x + linear(silu_mul(gu), 4 * i + 3);
  }
  return x;
}
