// Flag parsing for one attention case.
#include "cli_options.h"

#include <climits>
#include <cstdint>
#include <random>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace fmha::tools {

void add_case_options(CLI::App* app, RunOptions& o) {
  std::string backends = "auto|reference";
  for (Backend b : compiled_backends())
    if (b != Backend::reference) backends += std::string("|") + to_string(b);
  app->add_option("--backend", o.backend, backends)->capture_default_str();
  app->add_option("--batch", o.batch, "Batch size")->capture_default_str();
  app->add_option("--heads", o.heads, "Query heads")->capture_default_str();
  app->add_option("--kv-heads", o.kv_heads, "Key/value heads (default: heads)");
  app->add_option("--seqlen-q", o.seqlen_q, "Query sequence length")->capture_default_str();
  app->add_option("--seqlen-k", o.seqlen_k, "Key sequence length (default: seqlen-q)");
  app->add_option("--seqlens-q", o.seqlens_q,
                  "Variable-length (packed) batch: query length of each sequence, e.g. 100,2000,37 "
                  "(replaces --batch and --seqlen-q)");
  app->add_option("--seqlens-k", o.seqlens_k, "Key length of each sequence (default: seqlens-q)");
  app->add_option("--head-dim", o.head_dim, "Head dimension of q and k")->capture_default_str();
  app->add_option("--head-dim-v", o.head_dim_v, "Head dimension of v (default: head-dim)");
  app->add_option("--dtype", o.dtype,
                  "fp32|tf32|tf32x3|fp16|bf16 (tf32, tf32x3: fp32 storage with that --precision)")
      ->capture_default_str();
  app->add_option("--precision", o.precision,
                  "fp32 storage: ieee|tf32|tf32x3 (tf32x3: split tf32, fp32 accuracy on tf32 tensor cores; "
                  "default: ieee, or what --dtype tf32 / tf32x3 names)");
  app->add_option("--causal", o.causal, "none|top-left|bottom-right")->capture_default_str();
  app->add_option("--window", o.window, "Sliding window L,R (-1 = unbounded)");
  app->add_option("--q-offset", o.q_offset, "Absolute position of query 0")->capture_default_str();
  app->add_option("--mode", o.mode, "fwd|bwd")->capture_default_str();
  app->add_option("--iters", o.iters, "Timed iterations (default 20 on a GPU, 3 on the CPU; 0: no timing)");
  app->add_option("--warmup", o.warmup, "Untimed iterations first (default 5 on a GPU, 1 on the CPU)");
  app->add_option("--seed", o.seed, "Random seed of the inputs (default: fresh)");
  app->add_option("--threads", o.threads, "CPU backends: threads (0 = all)")->capture_default_str();
  app->add_option("--scale", o.scale, "Softmax scale (default 1/sqrt(head-dim))");
  app->add_flag("--deterministic", o.deterministic, "Backward bitwise reproducible: dQ summed in a fixed order");
  app->add_flag("--no-lse", o.no_lse, "Forward: do not write LSE");
  app->add_flag("--paged", o.paged,
                "K/V in a paged KV cache (decoding): each sequence's seqlen-k keys in pages of --page-size rows, "
                "in a random order; forward only");
  app->add_option("--page-size", o.page_size, "Rows per page of --paged (16 to 256)")->capture_default_str();
  app->add_option("--num-splits", o.num_splits,
                  "GPU decode kernel (a KV cache, or seqlen-q <= 16 in fp16/bf16): CTAs that split each sequence's "
                  "keys (0 = chosen from the shape and the SM count; up to 256)")
      ->capture_default_str();
}

namespace {

// "100,2000,37" as lengths, each >= 0 and below 2^31 (the sequence tables are int32, totals too).
bool parse_lengths(const char* flag, const std::string& text, std::vector<int64_t>* out, std::string* error) {
  constexpr int64_t kMaxTotal = INT32_MAX;
  std::istringstream in(text);
  std::string item;
  int64_t total = 0;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    long long value = -1;
    try {
      value = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || value < 0)
      return *error = std::string(flag) + ": expected comma-separated lengths >= 0, got '" + text + "'", false;
    total += value;
    if (total > kMaxTotal)
      return *error = std::string(flag) + ": the lengths add up to more than 2^31 - 1 tokens (int32 tables)", false;
    out->push_back(value);
  }
  if (out->empty() || text.back() == ',')
    return *error = std::string(flag) + ": expected comma-separated lengths >= 0, got '" + text + "'", false;
  return true;
}

}  // namespace

bool RunOptions::to_case(CaseSpec* spec, std::string* error) const {
  CaseSpec s;
  if (!parse(backend, &s.backend)) return *error = "--backend: unknown backend '" + backend + "'", false;
  const bool dtype_names_precision = dtype == "tf32" || dtype == "tf32x3";
  if (dtype_names_precision) {
    s.dtype = DType::fp32;
    parse(dtype, &s.precision);
  } else if (!parse(dtype, &s.dtype)) {
    return *error = "--dtype: expected fp32, tf32, tf32x3, fp16 or bf16, got '" + dtype + "'", false;
  }
  if (!precision.empty()) {
    Precision asked = Precision::ieee;
    if (!parse(precision, &asked))
      return *error = "--precision: expected ieee, tf32 or tf32x3, got '" + precision + "'", false;
    if (dtype_names_precision && asked != s.precision)
      return *error = "--precision: " + precision + " contradicts --dtype " + dtype + " (use --dtype fp32)", false;
    if (s.dtype != DType::fp32 && asked != Precision::ieee)
      return *error = "--precision: " + precision + " applies to fp32 storage only; --dtype is " + dtype, false;
    s.precision = asked;
  }
  if (!parse(causal, &s.causal))
    return *error = "--causal: expected none, top-left or bottom-right, got '" + causal + "'", false;
  if (mode == "fwd") s.mode = Direction::forward;
  else if (mode == "bwd") s.mode = Direction::backward;
  else return *error = "--mode: expected fwd or bwd, got '" + mode + "'", false;
  if (!window.empty()) {
    std::istringstream in(window);
    char comma = 0;
    if (!(in >> s.window_left >> comma >> s.window_right) || comma != ',' || !in.eof())
      return *error = "--window: expected L,R (two integers, -1 = unbounded), got '" + window + "'", false;
  }
  struct Size {
    const char* flag;
    int64_t value;
    bool zero_means_default;
  };
  for (const Size& z : {Size{"--batch", batch, false}, Size{"--heads", heads, false}, Size{"--kv-heads", kv_heads, true},
                        Size{"--seqlen-q", seqlen_q, false}, Size{"--seqlen-k", seqlen_k, true},
                        Size{"--head-dim", head_dim, false}, Size{"--head-dim-v", head_dim_v, true}})
    if (z.value < 0)
      return *error = std::string(z.flag) + ": expected a size >= 0, got " + std::to_string(z.value), false;
  if (threads < 0) return *error = "--threads: expected >= 0", false;
  s.batch = batch;
  s.heads = heads;
  s.kv_heads = kv_heads;
  s.seqlen_q = seqlen_q;
  s.seqlen_k = seqlen_k;
  s.head_dim = head_dim;
  s.head_dim_v = head_dim_v;
  // Zero means "same as" for these three; a zero key length must be asked for explicitly.
  if (seqlen_k == 0 && seqlen_q == 0) s.seqlen_k = 0;
  if (!seqlens_k.empty() && seqlens_q.empty())
    return *error = "--seqlens-k: needs --seqlens-q (the query lengths of the same sequences)", false;
  if (!seqlens_q.empty()) {
    if (!parse_lengths("--seqlens-q", seqlens_q, &s.seqlens_q, error)) return false;
    if (!seqlens_k.empty() && !parse_lengths("--seqlens-k", seqlens_k, &s.seqlens_k, error)) return false;
    if (!s.seqlens_k.empty() && s.seqlens_k.size() != s.seqlens_q.size())
      return *error = "--seqlens-k: has " + std::to_string(s.seqlens_k.size()) + " lengths, expected " +
                      std::to_string(s.seqlens_q.size()) + " (one per sequence of --seqlens-q)",
             false;
  }
  if (paged) {
    if (page_size < 1) return *error = "--page-size: expected a size >= 1, got " + std::to_string(page_size), false;
    if (!s.seqlens_q.empty())
      return *error = "--paged: does not combine with --seqlens-q (a paged cache takes dense queries)", false;
    s.page_size = page_size;
  }
  if (num_splits < 0) return *error = "--num-splits: expected >= 0, got " + std::to_string(num_splits), false;
  s.num_splits = num_splits;
  s.q_offset = q_offset;
  s.softmax_scale = scale;
  s.deterministic = deterministic;
  s.with_lse = !no_lse;
  s.num_threads = threads;
  s.seed = seed >= 0 ? uint64_t(seed) : uint64_t(std::random_device{}()) & 0x7fffffffull;
  *spec = s;
  return true;
}

bool choose_device(Backend backend, Device* device, std::string* error) {
  const bool gpu_tier = backend == Backend::cuda_simt || backend == Backend::cuda_sm80 || backend == Backend::cuda_sm90;
  if (backend == Backend::cpu || backend == Backend::reference) {
    *device = Device{};
    return true;
  }
  if (cuda_available()) {
    *device = Device{DeviceType::cuda, 0};
    return true;
  }
  if (gpu_tier) {
    bool compiled = false;
    for (Backend b : compiled_backends()) compiled = compiled || b == backend;
    *error = std::string("--backend: ") + to_string(backend) +
             (compiled ? " needs a CUDA device, and none was found" : " is not compiled into this build");
    return false;
  }
  *device = Device{};
  return true;
}

}  // namespace fmha::tools
