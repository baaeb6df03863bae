// See bench.h.
#include "bench.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <vector>

#include "common/numeric.h"
#include "harness.h"

#ifdef FMHA_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace fmha::tools {
namespace {

constexpr int64_t kFaTokens = 16384;   // FlashAttention's sweep: batch = 16k tokens / seqlen
constexpr int64_t kFaHidden = 2048;    // heads = hidden / head_dim
constexpr size_t kRotateBytes = size_t(256) << 20;  // rotate inputs until they span 256 MiB (> L2)
constexpr int kMaxInputSets = 8;

size_t input_bytes(const CaseSpec& c) {
  const CaseSpec s = c.resolved();
  const size_t e = dtype_size(s.dtype);
  size_t n = size_t(s.total_q() * s.heads * (s.head_dim + s.head_dim_v)) +
             size_t(s.total_k() * s.kv_heads * (s.head_dim + s.head_dim_v));
  if (s.mode == Direction::backward) n *= 2;
  return n * e;
}

std::string label_of(const CaseSpec& c) {
  const CaseSpec s = c.resolved();
  return std::string(to_string(s.mode)) + " " + s.dtype_name() + " b" + std::to_string(s.batch) + " h" +
         std::to_string(s.heads) + " s" + std::to_string(s.seqlen_q) + " d" + std::to_string(s.head_dim) +
         (s.causal != Causal::none ? " causal" : "") + (s.varlen() ? " varlen" : "") +
         (s.paged() ? " paged" + std::to_string(s.page_size) : "");
}

}  // namespace

std::vector<CaseSpec> fa_sweep(const CaseSpec& base) {
  std::vector<CaseSpec> cases;
  for (const char* dtype : {"bf16", "fp16"})
    for (Direction mode : {Direction::forward, Direction::backward})
      for (int64_t head_dim : {64, 128, 256})
        for (Causal causal : {Causal::none, Causal::bottom_right})
          for (int64_t seqlen : {512, 1024, 2048, 4096, 8192, 16384}) {
            CaseSpec c = base;
            parse(dtype, &c.dtype);
            c.precision = Precision::ieee;
            c.mode = mode;
            c.batch = kFaTokens / seqlen;
            c.heads = c.kv_heads = kFaHidden / head_dim;
            c.seqlen_q = c.seqlen_k = seqlen;
            c.head_dim = c.head_dim_v = head_dim;
            c.causal = causal;
            c.window_left = c.window_right = -1;
            c.q_offset = 0;
            cases.push_back(c);
          }
  return cases;
}

std::vector<CaseSpec> seed_sweep(const CaseSpec& base) {
  std::vector<CaseSpec> cases;
  for (const char* dtype : {"fp32", "tf32", "tf32x3", "bf16"})
    for (Direction mode : {Direction::forward, Direction::backward}) {
      CaseSpec c = base;
      c.batch = 4;
      c.heads = c.kv_heads = 4;
      c.seqlen_q = c.seqlen_k = 4096;
      c.head_dim = c.head_dim_v = 64;
      c.causal = Causal::none;
      c.window_left = c.window_right = -1;
      c.q_offset = 0;
      c.dtype = DType::fp32;
      c.precision = Precision::ieee;
      parse(dtype, &c.precision);  // tf32 and tf32x3: fp32 storage on the tensor cores
      if (std::string(dtype) == "bf16") c.dtype = DType::bf16;
      c.mode = mode;
      cases.push_back(c);
    }
  return cases;
}

// The CPU backend's shapes, fp32 and bf16, each direction: the three cases it is compared with
// PyTorch's CPU SDPA on (docs/PERF.md), short calls (where the fixed cost per call and the
// backward's kept score tiles matter) and decode-shaped calls (a few query rows per head, GQA).
namespace {
struct CpuSweepShape {
  int64_t batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim;
  Causal causal;
  bool backward;  // decode shapes are timed forward only
};
constexpr CpuSweepShape kCpuSweepShapes[] = {
    {4, 4, 4, 4096, 4096, 64, Causal::none, true},           // the seed shape
    {2, 8, 8, 2048, 2048, 128, Causal::bottom_right, true},
    {1, 32, 32, 1024, 1024, 128, Causal::none, true},
    {1, 4, 4, 192, 192, 128, Causal::none, true},            // short calls
    {1, 16, 16, 256, 256, 64, Causal::bottom_right, true},
    {8, 8, 8, 128, 128, 64, Causal::none, true},
    {1, 8, 1, 1, 32768, 128, Causal::bottom_right, false},   // decode: GQA 8, one row
    {1, 32, 8, 1, 8192, 128, Causal::bottom_right, false},   // GQA 4
    {4, 32, 8, 1, 4096, 128, Causal::bottom_right, false},
    {1, 32, 8, 16, 8192, 128, Causal::bottom_right, false},  // 16 rows (speculative decoding)
};
}  // namespace

std::vector<CaseSpec> cpu_sweep(const CaseSpec& base) {
  std::vector<CaseSpec> cases;
  for (const char* dtype : {"fp32", "bf16"})
    for (Direction mode : {Direction::forward, Direction::backward})
      for (const CpuSweepShape& shape : kCpuSweepShapes) {
        if (mode == Direction::backward && !shape.backward) continue;
        CaseSpec c = base;
        parse(dtype, &c.dtype);
        c.precision = Precision::ieee;
        c.mode = mode;
        c.batch = shape.batch;
        c.heads = shape.heads;
        c.kv_heads = shape.kv_heads;
        c.seqlen_q = shape.seqlen_q;
        c.seqlen_k = shape.seqlen_k;
        c.head_dim = c.head_dim_v = shape.head_dim;
        c.causal = shape.causal;
        c.window_left = c.window_right = -1;
        c.q_offset = 0;
        c.seqlens_q = c.seqlens_k = {};
        c.page_size = 0;
        cases.push_back(c);
      }
  return cases;
}

namespace {

// The decoding target (issue: a paged KV cache): one query token per sequence against a long KV
// cache, 32 query heads over 8 KV heads, D128, bf16 unless --dtype says otherwise; batch x KV
// length as below, each with the contiguous cache and a paged one (pages of --page-size rows, 64
// by default, shuffled). Bound by reading K and V: reported as TB/s of Q, K, V and O bytes once.
constexpr int64_t kDecodeHeads = 32, kDecodeKvHeads = 8, kDecodeDim = 128;
constexpr int64_t kDecodeShapes[][2] = {{1, 8192}, {1, 131072}, {16, 8192}, {16, 32768}, {64, 8192}};
constexpr int64_t kDecodePageSize = 64;  // `fmha tune --sweep decode` without --paged: its paged cases

std::vector<CaseSpec> decode_sweep(const CaseSpec& base, int64_t page_size) {
  std::vector<CaseSpec> cases;
  for (const auto& [batch, seqlen_k] : kDecodeShapes)
    for (bool paged : {false, true}) {
      CaseSpec c = base;
      c.mode = Direction::forward;
      c.batch = batch;
      c.heads = kDecodeHeads;
      c.kv_heads = kDecodeKvHeads;
      c.seqlen_q = 1;
      c.seqlen_k = seqlen_k;
      c.head_dim = c.head_dim_v = kDecodeDim;
      c.causal = Causal::bottom_right;
      c.window_left = c.window_right = -1;
      c.q_offset = 0;
      c.seqlens_q = c.seqlens_k = {};
      c.page_size = paged ? page_size : 0;
      cases.push_back(c);
    }
  return cases;
}

}  // namespace

bool named_sweep(const std::string& name, const CaseSpec& base, std::vector<CaseSpec>* cases) {
  if (name == "fa") *cases = fa_sweep(base);
  else if (name == "seed") *cases = seed_sweep(base);
  else if (name == "cpu") *cases = cpu_sweep(base);
  else if (name == "decode") *cases = decode_sweep(base, base.paged() ? base.page_size : kDecodePageSize);
  else return false;
  return true;
}

namespace {

// The packed-batch target: 64 sequences with lengths drawn log-uniformly from 128 to 8k
// (about 128k tokens), D128 (16 heads: hidden 2048), causal; each next to the dense batch of the
// same count at the mean length, which is what the varlen throughput is measured against.
constexpr int kVarlenSequences = 64;
constexpr double kVarlenMinLength = 128, kVarlenMaxLength = 8192;
constexpr uint64_t kVarlenLengthSeed = 13;  // the same lengths on every machine and run

std::vector<int64_t> varlen_lengths() {
  std::mt19937_64 rng(kVarlenLengthSeed);
  std::uniform_real_distribution<double> log_length(std::log(kVarlenMinLength), std::log(kVarlenMaxLength));
  std::vector<int64_t> lengths;
  for (int i = 0; i < kVarlenSequences; ++i) lengths.push_back(int64_t(std::exp(log_length(rng))));
  return lengths;
}

std::vector<CaseSpec> varlen_sweep(const CaseSpec& base) {
  const std::vector<int64_t> lengths = varlen_lengths();
  const int64_t mean = std::accumulate(lengths.begin(), lengths.end(), int64_t(0)) / int64_t(lengths.size());
  std::vector<CaseSpec> cases;
  for (const char* dtype : {"bf16", "fp16"})
    for (Direction mode : {Direction::forward, Direction::backward})
      for (bool packed : {true, false}) {
        CaseSpec c = base;
        parse(dtype, &c.dtype);
        c.precision = Precision::ieee;
        c.mode = mode;
        c.heads = c.kv_heads = kFaHidden / 128;
        c.head_dim = c.head_dim_v = 128;
        c.causal = Causal::bottom_right;
        c.window_left = c.window_right = -1;
        c.q_offset = 0;
        c.seqlens_q = c.seqlens_k = {};
        if (packed) {
          c.seqlens_q = lengths;
        } else {
          c.batch = int64_t(lengths.size());
          c.seqlen_q = c.seqlen_k = mean;
        }
        cases.push_back(c);
      }
  return cases;
}


}  // namespace

void progress_bar(size_t done, size_t total, const std::string& label, bool enabled) {
  if (!enabled) return;
  constexpr int kWidth = 30;
  const int filled = total ? int(kWidth * done / total) : kWidth;
  std::fprintf(stderr, "\r[%s%s] %zu/%zu %-48s", std::string(size_t(filled), '#').c_str(),
               std::string(size_t(kWidth - filled), '.').c_str(), done, total, label.c_str());
  if (done == total) std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

namespace {

// ---- The merge sweep: fmha::merge's bandwidth next to a plain copy on the same device ----------

// Rows of tokens x heads, as in split-KV decoding (few tokens) and ring attention (many); head
// dim 128. Parts and result in the run's dtype; the lse tensors are fp32.
constexpr int64_t kMergeHeads = 32, kMergeDim = 128;
constexpr int64_t kMergeTokens[] = {512, 8192, 65536};

double median_of(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  return ms.size() % 2 ? ms[ms.size() / 2] : 0.5 * (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]);
}

// Median milliseconds of `body` (warm-up first): CUDA events on a GPU, the steady clock on the CPU.
template <class Body>
double time_ms(Device device, int warmup, int iters, Body&& body) {
  for (int i = 0; i < warmup; ++i) body();
  std::vector<double> ms;
#ifdef FMHA_WITH_CUDA
  if (device.type == DeviceType::cuda) {
    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    for (int i = 0; i < iters; ++i) {
      cudaEventRecord(start);
      body();
      cudaEventRecord(stop);
      cudaEventSynchronize(stop);
      float elapsed = 0.f;
      cudaEventElapsedTime(&elapsed, start, stop);
      ms.push_back(double(elapsed));
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    return median_of(ms);
  }
#endif
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    body();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return median_of(ms);
}

int run_merge_bench(const BenchOptions& opt, const CaseSpec& base, Device device) {
  const bool gpu = device.type == DeviceType::cuda;
  const int iters = opt.run.iters >= 0 ? std::max(opt.run.iters, 1) : (gpu ? 20 : 3);
  const int warmup = opt.run.warmup >= 0 ? opt.run.warmup : (gpu ? 5 : 1);
  const DType dtype = base.dtype;
  // The forms: parts and result in the run's dtype; with a 16-bit dtype also ring attention's
  // accumulate, an fp32 accumulator (out_a, merged into in place) and a part in the run's dtype.
  struct Form {
    DType acc;  // out_a and out
    std::string name;
  };
  std::vector<Form> forms = {{dtype, to_string(dtype)}};
  if (dtype_size(dtype) == 2) forms.push_back({DType::fp32, std::string("fp32+") + to_string(dtype)});
  std::printf("%-8s %-9s %8s %6s %5s %10s %9s %9s %7s\n", "device", "dtype", "tokens", "heads", "dim", "ms",
              "GB/s", "copy GB/s", "ratio");
  nlohmann::json results = nlohmann::json::array();
  int failures = 0, cases = 0;
  for (int64_t tokens : kMergeTokens) {
    for (const Form& form : forms) {
      ++cases;
      const bool accumulate = form.acc != dtype;
      const int64_t rows = tokens * kMergeHeads, elements = rows * kMergeDim;
      const size_t part_bytes = size_t(elements) * dtype_size(dtype), acc_bytes = size_t(elements) * dtype_size(form.acc);
      const size_t lse_bytes = size_t(rows) * sizeof(float);
      Buffer out_a(device, acc_bytes), out_b(device, part_bytes), out(device, accumulate ? 1 : acc_bytes),
          copy(device, part_bytes);
      Buffer lse_a(device, lse_bytes), lse_b(device, lse_bytes), lse(device, accumulate ? 1 : lse_bytes);
      // Finite LSEs: every row reads both sides (a -inf side would skip its reads and flatter the rate).
      std::vector<unsigned char> host_acc(acc_bytes), host_part(part_bytes);
      std::vector<float> host_lse(static_cast<size_t>(rows));
      std::mt19937_64 rng(base.seed);
      std::normal_distribution<float> normal;
      for (int64_t i = 0; i < elements; ++i) {
        const float x = normal(rng);
        store_element(host_acc.data(), form.acc, i, x);
        store_element(host_part.data(), dtype, i, x);
      }
      for (float& x : host_lse) x = normal(rng);
      out_a.upload(host_acc.data());
      out_b.upload(host_part.data());
      lse_a.upload(host_lse.data());
      lse_b.upload(host_lse.data());
      MergeParams m;
      auto view = [&](const Buffer& b, DType t) {
        return make_tensor(b.data(), t, {1, tokens, kMergeHeads, kMergeDim}, device);
      };
      auto lse_view = [&](const Buffer& b) {
        return make_tensor(b.data(), DType::fp32, {1, kMergeHeads, tokens}, device);
      };
      m.out_a = view(out_a, form.acc), m.out_b = view(out_b, dtype);
      m.lse_a = lse_view(lse_a), m.lse_b = lse_view(lse_b);
      // The accumulate form merges in place (merge_into); the other writes a third tensor.
      m.out = accumulate ? m.out_a : view(out, dtype);
      m.lse = accumulate ? m.lse_a : lse_view(lse);
      m.num_threads = base.num_threads;
      Status status;
      const double merge_ms = time_ms(device, warmup, iters, [&] {
        if (status.ok()) status = merge(m);
      });
      // The copy reads and writes one part's bytes: the device's copy bandwidth for this size.
      const double copy_ms = time_ms(device, warmup, iters, [&] {
#ifdef FMHA_WITH_CUDA
        if (gpu) {
          cudaMemcpyAsync(copy.data(), out_b.data(), part_bytes, cudaMemcpyDeviceToDevice);
          return;
        }
#endif
        std::memcpy(copy.data(), out_b.data(), part_bytes);
      });
      // Read a and b, write out (the accumulator's bytes twice in the accumulate form).
      const double moved = 2.0 * double(acc_bytes) + double(part_bytes) + 3.0 * double(lse_bytes);
      const double gbps = status.ok() && merge_ms > 0 ? moved / (merge_ms * 1e-3) / 1e9 : 0.0;
      const double copy_gbps = copy_ms > 0 ? 2.0 * double(part_bytes) / (copy_ms * 1e-3) / 1e9 : 0.0;
      if (!status.ok()) {
        ++failures;
        std::printf("%-8s %-9s %8lld %6lld %5lld  n/a: %s\n", gpu ? "cuda" : "cpu", form.name.c_str(),
                    (long long)tokens, (long long)kMergeHeads, (long long)kMergeDim, status.message.c_str());
      } else {
        std::printf("%-8s %-9s %8lld %6lld %5lld %10.4f %9.1f %9.1f %7.2f\n", gpu ? "cuda" : "cpu", form.name.c_str(),
                    (long long)tokens, (long long)kMergeHeads, (long long)kMergeDim, merge_ms, gbps, copy_gbps,
                    copy_gbps > 0 ? gbps / copy_gbps : 0.0);
      }
      results.push_back({{"device", device_description(device)}, {"dtype", form.name}, {"tokens", tokens},
                         {"heads", kMergeHeads}, {"head_dim_v", kMergeDim}, {"ms", merge_ms}, {"gbps", gbps},
                         {"copy_gbps", copy_gbps}, {"status", status.ok() ? "ok" : status.message}});
    }
  }
  if (opt.json_out == "-") std::cout << results.dump(2) << "\n";
  else if (!opt.json_out.empty()) std::ofstream(opt.json_out) << results.dump(2) << "\n";
  return failures == cases ? 1 : 0;
}

}  // namespace

void add_bench_options(CLI::App* app, BenchOptions& o) {
  app->add_option("--sweep", o.sweep,
                  "Named sweep: fa (FlashAttention's), seed (B4 H4 S4096 D64) or varlen (64 packed sequences of "
                  "128 to 8k tokens, D128 causal, and the dense batch at their mean length) or merge (fmha::merge's "
                  "bandwidth next to a copy; bf16 unless --dtype says otherwise, 16-bit parts also merged into an fp32 accumulator in place) or decode (one query token "
                  "against a KV cache of 8k to 128k keys, 32/8 heads, D128, contiguous and paged by --page-size; "
                  "bf16 unless --dtype says otherwise; TB/s of Q, K, V, O bytes once) or cpu (the CPU backend's "
                  "shapes: three long cases, short calls and decode-shaped GQA calls; fp32 and bf16)");
  app->add_option("--csv", o.csv, "Write results as CSV to this file");
  app->add_option("--json-out", o.json_out, "Write results as JSON to this file ('-' for stdout)");
  app->add_option("--rotate", o.rotate, "Input sets to rotate through (default: enough to exceed the L2 cache)");
  app->add_flag("--no-progress", o.no_progress, "No progress bar");
}

int run_bench(const BenchOptions& opt) {
  CaseSpec base;
  std::string error;
  if (!opt.run.to_case(&base, &error)) {
    std::cerr << "fmha bench: " << error << "\n";
    return 2;
  }
  if (opt.sweep == "merge") {
    Device device;
    if (!choose_device(base.backend, &device, &error)) {
      std::cerr << "fmha bench: " << error << "\n";
      return 2;
    }
    if (base.dtype == DType::fp32 && !opt.dtype_given) base.dtype = DType::bf16;
    return run_merge_bench(opt, base, device);
  }
  std::vector<CaseSpec> cases;
  if (opt.sweep.empty()) cases = {base};
  else if (opt.sweep == "varlen") cases = varlen_sweep(base);
  else if (opt.sweep == "decode") {
    if (!opt.dtype_given) base.dtype = DType::bf16;
    cases = decode_sweep(base, opt.run.page_size);
  } else if (!named_sweep(opt.sweep, base, &cases)) {
    std::cerr << "fmha bench: --sweep: expected fa, seed, cpu, varlen, merge or decode, got '" << opt.sweep << "'\n";
    return 2;
  }
  if (!opt.sweep.empty()) {
    // An explicit --dtype / --mode picks that part of the sweep.
    std::erase_if(cases, [&](const CaseSpec& c) {
      return (opt.dtype_given && c.dtype_name() != opt.run.dtype) || (opt.mode_given && c.mode != base.mode);
    });
  }
  Device device;
  if (!choose_device(base.backend, &device, &error)) {
    std::cerr << "fmha bench: " << error << "\n";
    return 2;
  }
  const bool gpu = device.type == DeviceType::cuda;
  const int iters = opt.run.iters >= 0 ? std::max(opt.run.iters, 1) : (gpu ? 20 : 3);
  const int warmup = opt.run.warmup >= 0 ? opt.run.warmup : (gpu ? 5 : 1);
  const bool show_progress = !opt.no_progress && isatty(fileno(stderr));

  nlohmann::json results = nlohmann::json::array();
  std::ofstream csv;
  if (!opt.csv.empty()) {
    csv.open(opt.csv);
    if (!csv) {
      std::cerr << "fmha bench: --csv: cannot write '" << opt.csv << "'\n";
      return 2;
    }
    csv << "backend,device,mode,dtype,batch,heads,kv_heads,seqlen_q,seqlen_k,head_dim,head_dim_v,causal,ms,tflops,status,varlen_sequences,tokens_q,page_size,tbps\n";
  }
  std::printf("%-6s %-5s %-5s %6s %6s %7s %7s %5s %-12s %-6s %10s %9s %8s\n", "mode", "dtype", "back", "batch", "heads",
              "seqlen", "seq_k", "dim", "causal", "kv", "ms", "TFLOP/s", "TB/s");
  int failures = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const CaseSpec c = cases[i].resolved();
    progress_bar(i, cases.size(), label_of(c), show_progress);
    std::string status = "ok", backend = "-";
    double ms = 0.0, tflops = 0.0, tbps = 0.0;
    const std::string kv = c.paged() ? "p" + std::to_string(c.page_size) : (c.varlen() ? "packed" : "dense");
    try {
      const int sets = opt.rotate > 0 ? opt.rotate
                                      : int(std::clamp<size_t>(kRotateBytes / std::max<size_t>(input_bytes(c), 1), 1,
                                                               kMaxInputSets));
      Harness h(c, device, gpu ? sets : 1);
      Status s = h.time(warmup, iters, &ms);
      if (s.ok()) {
        backend = to_string(h.backend_used());
        tflops = c.flops() / (ms * 1e-3) / 1e12;
        tbps = c.bytes() / (ms * 1e-3) / 1e12;
      } else {
        status = s.message;
        ++failures;
      }
    } catch (const std::exception& e) {
      status = e.what();
      ++failures;
    }
    if (show_progress) std::fprintf(stderr, "\r%*s\r", 100, "");
    if (status == "ok")  // CPU rates (below 1 TFLOP/s) with four decimals: GFLOP/s to one
      std::printf(tflops < 1.0 ? "%-6s %-5s %-5s %6lld %6lld %7lld %7lld %5lld %-12s %-6s %10.3f %9.4f %8.4f\n"
                               : "%-6s %-5s %-5s %6lld %6lld %7lld %7lld %5lld %-12s %-6s %10.3f %9.2f %8.3f\n",
                  to_string(c.mode), c.dtype_name().c_str(), backend.c_str(), (long long)c.batch, (long long)c.heads,
                  (long long)c.seqlen_q, (long long)c.seqlen_k, (long long)c.head_dim, to_string(c.causal), kv.c_str(),
                  ms, tflops, tbps);
    else
      std::printf("%-6s %-5s %-5s %6lld %6lld %7lld %7lld %5lld %-12s %-6s  n/a: %s\n", to_string(c.mode),
                  c.dtype_name().c_str(), backend.c_str(), (long long)c.batch, (long long)c.heads, (long long)c.seqlen_q,
                  (long long)c.seqlen_k, (long long)c.head_dim, to_string(c.causal), kv.c_str(), status.c_str());
    if (c.varlen())
      std::printf("       (varlen: %zu sequences, %lld tokens, mean %lld; batch and seqlen above: count and longest)\n",
                  c.seqlens_q.size(), (long long)c.total_q(), (long long)(c.total_q() / int64_t(c.seqlens_q.size())));
    std::fflush(stdout);
    nlohmann::json j = {{"backend", backend},      {"device", device_description(device)},
                        {"mode", to_string(c.mode)}, {"dtype", c.dtype_name()},
                        {"batch", c.batch},        {"heads", c.heads},
                        {"kv_heads", c.kv_heads},  {"seqlen_q", c.seqlen_q},
                        {"seqlen_k", c.seqlen_k},  {"head_dim", c.head_dim},
                        {"head_dim_v", c.head_dim_v}, {"causal", to_string(c.causal)},
                        {"ms", ms},                {"tflops", tflops},
                        {"tbps", tbps},            {"status", status}};
    if (c.paged()) j["page_size"] = c.page_size;
    if (backend == "cpu") j["cpu_path"] = cpu_paths().selected;
    if (c.varlen()) {
      j["seqlens_q"] = c.seqlens_q;
      j["seqlens_k"] = c.seqlens_k;
    }
    results.push_back(j);
    if (csv) {
      std::string quoted = status;
      std::replace(quoted.begin(), quoted.end(), '"', '\'');
      csv << backend << ",\"" << j["device"].get<std::string>() << "\"," << to_string(c.mode) << "," << c.dtype_name()
          << "," << c.batch << "," << c.heads << "," << c.kv_heads << "," << c.seqlen_q << "," << c.seqlen_k << ","
          << c.head_dim << "," << c.head_dim_v << "," << to_string(c.causal) << "," << ms << "," << tflops << ",\""
          << quoted << "\"," << c.seqlens_q.size() << "," << c.total_q() << "," << c.page_size << "," << tbps << "\n";
      csv.flush();  // a sweep cut short keeps the rows it finished
    }
  }
  progress_bar(cases.size(), cases.size(), "done", show_progress);
  if (opt.json_out == "-") std::cout << results.dump(2) << "\n";
  else if (!opt.json_out.empty()) {
    std::ofstream out(opt.json_out);
    if (!out) {
      std::cerr << "fmha bench: --json-out: cannot write '" << opt.json_out << "'\n";
      return 2;
    }
    out << results.dump(2) << "\n";
  }
  return failures == int(cases.size()) ? 1 : 0;
}

}  // namespace fmha::tools
