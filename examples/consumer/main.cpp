// The smallest program against an installed fmha: one CPU forward (causal, GQA) through the
// public API, checked against the fp64 oracle (backend = reference). Exits non-zero on any error
// or when the two outputs differ by more than fp32 rounding explains.
#include <fmha/fmha.h>

#include <cmath>
#include <cstdio>
#include <utility>
#include <vector>

int main() {
  const int64_t batch = 1, seqlen = 37, heads = 4, kv_heads = 2, head_dim = 32;
  std::vector<float> q(batch * seqlen * heads * head_dim), k(batch * seqlen * kv_heads * head_dim), v(k.size());
  // Inputs in [-1, 1) from a fixed linear congruential sequence: the same on every run.
  uint32_t state = 12345;
  for (std::vector<float>* x : {&q, &k, &v}) {
    for (float& e : *x) {
      state = state * 1664525u + 1013904223u;
      e = float(state >> 8) / float(1u << 23) - 1.0f;
    }
  }

  // [batch, seqlen, heads, head_dim] outputs of the fast CPU path and of the oracle
  std::vector<float> out_cpu(q.size()), out_reference(q.size());
  fmha::Params params;
  params.q = fmha::make_tensor(q.data(), fmha::DType::fp32, {batch, seqlen, heads, head_dim});
  params.k = fmha::make_tensor(k.data(), fmha::DType::fp32, {batch, seqlen, kv_heads, head_dim});
  params.v = fmha::make_tensor(v.data(), fmha::DType::fp32, {batch, seqlen, kv_heads, head_dim});
  params.causal = fmha::Causal::bottom_right;
  for (auto [backend, out] : {std::pair{fmha::Backend::cpu, &out_cpu},
                              std::pair{fmha::Backend::reference, &out_reference}}) {
    params.backend = backend;
    params.o = fmha::make_tensor(out->data(), fmha::DType::fp32, {batch, seqlen, heads, head_dim});
    const fmha::Status status = fmha::forward(params);
    if (!status.ok()) {
      std::fprintf(stderr, "fmha::forward (%s): %s\n", fmha::to_string(backend), status.message.c_str());
      return 1;
    }
  }

  bool finite = true;
  double max_error = 0.0;
  for (size_t i = 0; i < out_cpu.size(); ++i) {
    finite = finite && std::isfinite(out_cpu[i]);
    max_error = std::fmax(max_error, std::fabs(double(out_cpu[i]) - double(out_reference[i])));
  }
  const double tolerance = 1e-5;  // outputs are O(1); fp32 accumulation over 37 keys errs ~1e-7
  const bool pass = finite && max_error <= tolerance;
  std::printf("fmha %s: cpu vs reference, max |error| %.2e (tolerance %.0e): %s\n", fmha::version(), max_error,
              tolerance, pass ? "ok" : "FAILED");
  return pass ? 0 : 1;
}
