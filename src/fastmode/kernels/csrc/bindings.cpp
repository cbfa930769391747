// Python bindings for fastmode's CPU kernels (built on first use by fastmode.kernels).
#include <torch/extension.h>

torch::Tensor quant_matmul(torch::Tensor x, torch::Tensor w, int64_t qtype, bool int8_activations);
torch::Tensor quant_dequantize(torch::Tensor w, int64_t qtype, int64_t k, torch::Tensor rows);
torch::Tensor pack_weight(torch::Tensor w, int64_t qtype, int64_t k);
torch::Tensor unpack_weight(torch::Tensor p, int64_t qtype, int64_t k);
torch::Tensor packed_matmul(torch::Tensor x, torch::Tensor p, int64_t qtype);
torch::Tensor packed_matmul_reference(torch::Tensor x, torch::Tensor p, int64_t qtype);
torch::Tensor packed_dequantize(torch::Tensor p, int64_t qtype, int64_t k, torch::Tensor rows);
bool has_avx2();
std::string isa();
std::string int8_dot();
int64_t fp32_lanes();
int64_t direct_max_rows();
std::string amx_unavailable_reason();
int64_t amx_tile_rows();
torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                     torch::Tensor block_tables, torch::Tensor context_lens, double scale);
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor w, double eps);
torch::Tensor silu_mul(torch::Tensor x);
torch::Tensor rope_qkv(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, int64_t heads, int64_t kv_heads,
                       int64_t head_dim, torch::Tensor slots, torch::Tensor k_cache, torch::Tensor v_cache);
torch::Tensor decode_layers(torch::Tensor x, std::vector<torch::Tensor> norms, std::vector<torch::Tensor> weights,
                            std::vector<int64_t> qtypes, std::vector<int64_t> parts,
                            std::vector<torch::Tensor> k_caches, std::vector<torch::Tensor> v_caches,
                            torch::Tensor cos, torch::Tensor sin, torch::Tensor slots, torch::Tensor block_tables,
                            torch::Tensor context_lens, int64_t heads, int64_t kv_heads, int64_t head_dim, double eps,
                            double scale, bool int8_activations);

// Every compute entry point releases the GIL while it runs (arguments are
// converted before, the result after): the server's event loop keeps
// streaming tokens and taking requests while the engine thread computes.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using nogil = py::call_guard<py::gil_scoped_release>;
  m.def("quant_matmul", &quant_matmul, "x (M,K) fp32 @ W^T, W in ggml blocks (N, row_bytes) uint8 -> (M,N) fp32; optionally int8 activations", nogil());
  m.def("quant_dequantize", &quant_dequantize, "rows of a ggml-block weight -> fp32 (all rows if `rows` is empty)", nogil());
  m.def("pack_weight", &pack_weight, "Q4_0/Q4_1/Q8_0 blocks (N, row_bytes) -> eight-row interleaved records (packed_int8.cpp)", nogil());
  m.def("unpack_weight", &unpack_weight, "packed records -> the file's blocks, exactly", nogil());
  m.def("packed_matmul", &packed_matmul, "x (M,K) fp32 @ packed W^T -> (M,N) fp32 with int8 activations", nogil());
  m.def("packed_matmul_reference", &packed_matmul_reference, "packed_matmul through the portable loop: the bit-exact reference", nogil());
  m.def("packed_dequantize", &packed_dequantize, "rows of a packed weight -> fp32 (embedding lookups)", nogil());
  m.def("paged_decode_attention", &paged_decode_attention, "one query per sequence over a paged KV cache, fp32", nogil());
  m.def("rms_norm", &rms_norm, "RMSNorm over the last dimension, fp32", nogil());
  m.def("silu_mul", &silu_mul, "silu(gate) * up for x = [gate | up], fp32", nogil());
  m.def("rope_qkv", &rope_qkv, "RoPE on a fused qkv row; k and v written to their cache slots; returns q", nogil());
  m.def("decode_layers", &decode_layers, "every decoder layer of a pure-decode step in one call", nogil());
  m.def("has_avx2", &has_avx2, "whether the AVX2/FMA/F16C paths were compiled in");
  m.def("isa", &isa, "the ISA path this build runs (a key of fastmode.kernels.ISA_PATHS)");
  m.def("int8_dot", &int8_dot, "how the int8-activation path forms its dot products: vpdpbusd (VNNI), vpmaddubsw+vpmaddwd or scalar");
  m.def("amx_unavailable_reason", &amx_unavailable_reason, "why the fp32 path does not run on AMX tiles (empty when it does)");
  m.def("direct_max_rows", &direct_max_rows, "activation rows up to which the matmul reads blocks directly; more take another kernel");
  m.def("amx_tile_rows", &amx_tile_rows, "activation rows per AMX tile pass (0 where AMX does not run)");
  m.def("fp32_lanes", &fp32_lanes, "vector width of the fp32 matmul path: 16 (AVX-512), 8 (AVX2), 1 (portable)");
}
