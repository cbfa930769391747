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

#include "packed_int8.h"

using namespace fastmode::packed;

namespace {

void check_packable(int64_t qt) {
  TORCH_CHECK(packable(qt), "fastmode kernels: only Q4_0 (2), Q4_1 (3) and Q8_0 (8) are packed, got type ", qt);
}

// The kernels' `par`: at::parallel_for.
const auto par = [](int64_t begin, int64_t end, int64_t grain, auto&& f) { at::parallel_for(begin, end, grain, f); };

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
  const Activations& a = quantize_activations(x.data_ptr<float>(), M, K, par);
  const uint8_t* wp = p.data_ptr<uint8_t>();
  float* op = out.data_ptr<float>();
  check_packable(qtype);
  with_packable(qtype, [&](auto t) {
#if PK_AVX2
    matmul_avx2<decltype(t)::value>(a, M, K, wp, n, op, par);
#else
    matmul_scalar<decltype(t)::value>(a, M, K, wp, n, op, par);
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
  with_packable(qtype, [&](auto t) { matmul_scalar<decltype(t)::value>(a, M, K, p.data_ptr<uint8_t>(), n, out.data_ptr<float>(), par); });
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
