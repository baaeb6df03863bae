// fmha — fused multi-head attention, forward and backward. (C++17 and later.)
// The whole public C++ API: tensor views, the one Params struct that carries a call to every
// backend, and the entry points (forward, backward, supports, workspace_size, select_backend).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

namespace fmha {

const char* version();

// ---------------------------------------------------------------------------------------------
// Tensor views
// ---------------------------------------------------------------------------------------------

enum class DType : int { fp32, fp16, bf16 };
enum class DeviceType : int { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;  // CUDA device ordinal; 0 for the CPU
  friend bool operator==(const Device& a, const Device& b) { return a.type == b.type && a.index == b.index; }
  friend bool operator!=(const Device& a, const Device& b) { return !(a == b); }
};

inline constexpr int kMaxRank = 4;

// A non-owning strided view. Strides are in elements (not bytes); the last dimension must be
// contiguous (stride 1) wherever it has more than one element. Sizes and strides are int64.
struct Tensor {
  void* data = nullptr;
  DType dtype = DType::fp32;
  Device device{};
  int rank = 0;
  int64_t shape[kMaxRank] = {};
  int64_t stride[kMaxRank] = {};

  int64_t size(int dim) const { return shape[dim]; }
  int64_t numel() const;
  bool defined() const { return rank > 0; }
};

// A contiguous (row-major) view of `shape`.
Tensor make_tensor(void* data, DType dtype, std::initializer_list<int64_t> shape, Device device = {});
// A view with explicit element strides.
Tensor make_tensor(void* data, DType dtype, std::initializer_list<int64_t> shape,
                   std::initializer_list<int64_t> strides, Device device = {});

size_t dtype_size(DType dtype);

// ---------------------------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------------------------

// Causal masking. Query row i (0-based, local to the call) sits at absolute position
//
//     pos(i) = i + q_offset                          for none and top-left
//     pos(i) = i + q_offset + seqlen_k - seqlen_q    for bottom-right
//
// and key j sits at position j. Causal attention lets query i see keys j <= pos(i).
//   top-left:     the first query is aligned with the first key (query 0 sees key 0 only).
//   bottom-right: the last query is aligned with the last key (query seqlen_q-1 sees every key),
//                 as when the queries are the newest tokens of a sequence whose keys are all cached.
// With seqlen_q > seqlen_k and bottom-right, the first seqlen_q - seqlen_k rows see no key.
enum class Causal : int { none, top_left, bottom_right };

// For fp32 storage: `ieee` computes in exact fp32 (FMA) arithmetic; `tf32` lets GPU tiers use
// tf32 tensor cores (the CPU path emulates it by rounding the matmul operands to tf32).
// fp16 and bf16 storage always multiply in their own format with fp32 accumulation; `tf32` is
// an error for them.
enum class Precision : int { ieee, tf32 };

// Which implementation runs a call. `auto_select` picks the fastest one that supports the call
// (select_backend says which). `reference` is the fp64 oracle: exact, slow, CPU only.
enum class Backend : int { auto_select, reference, cpu, cuda_simt, cuda_sm80, cuda_sm90 };

enum class Direction : int { forward, backward };

// ---------------------------------------------------------------------------------------------
// The call
// ---------------------------------------------------------------------------------------------

// One plain struct carries a call to every backend.
//
// Shapes (B = batch, Sq/Sk = seqlen_q/seqlen_k, H = heads, Hkv = kv_heads, D/Dv = head dims):
//   q, o, dout, dq : [B, Sq, H, D]    (o, dout: last dim Dv)
//   k, dk          : [B, Sk, Hkv, D]
//   v, dv          : [B, Sk, Hkv, Dv]
//   lse            : [B, H, Sq], fp32, natural log of the softmax denominator (scaled scores)
// The [B, H, S, D] layout is a view with strides {H*S*D, D, S*D, 1}.
// H must be a multiple of Hkv (GQA/MQA): query head h reads KV head h / (H / Hkv).
//
// forward writes o and (when lse is defined) lse.
// backward reads q, k, v, o, dout, lse and writes dq, dk, dv; dk/dv are summed over the query
// heads that share a KV head. (The cpu and simt backends recompute each row's softmax max and sum
// from q and k rather than taking them from lse, whose fp32 rounding costs accuracy when logits
// are large; lse must still be given.)
// A query row that sees no key gets o = 0, lse = -inf and zero gradients.
struct Params {
  Tensor q, k, v;
  Tensor o, lse;
  Tensor dout, dq, dk, dv;

  float softmax_scale = 0.0f;  // 0: 1/sqrt(head_dim)
  Causal causal = Causal::none;
  // Sliding window around pos(i): query i sees keys pos(i) - window_left ... pos(i) + window_right.
  // -1 = unbounded on that side. With causal masking, window_right must be -1 or 0.
  int64_t window_left = -1;
  int64_t window_right = -1;
  // Absolute position of query row 0 (a KV cache's length before these queries). May be negative.
  int64_t q_offset = 0;

  Precision precision = Precision::ieee;
  bool deterministic = false;  // backward: bitwise reproducible results (no atomics)
  Backend backend = Backend::auto_select;

  void* stream = nullptr;      // cudaStream_t for GPU backends; nullptr = legacy default stream
  void* workspace = nullptr;   // device memory of at least workspace_size(...) bytes (GPU backends)
  size_t workspace_bytes = 0;
  int num_threads = 0;         // CPU backends: 0 = all hardware threads
};

enum class Code : int { ok, invalid_argument, unsupported, no_device, cuda_error, internal };

struct Status {
  Code code = Code::ok;
  std::string message;
  bool ok() const { return code == Code::ok; }
  explicit operator bool() const { return ok(); }
  static Status success() { return {}; }
};

class Error : public std::runtime_error {
 public:
  Error(Code code, const std::string& message) : std::runtime_error(message), code_(code) {}
  Code code() const { return code_; }

 private:
  Code code_;
};

// Throws fmha::Error when `status` is not ok.
void throw_if_error(const Status& status);

// Runs the call. On any error nothing is written to any output and the Status says which
// argument is wrong and what was expected.
Status forward(const Params& params);
Status backward(const Params& params);

// Whether the call could run (with the backend it names, or any backend for auto_select), and
// if not, why. Does no work and writes nothing.
Status supports(const Params& params, Direction direction);

// The backend that forward/backward would run (resolving auto_select). Errors as supports().
Status select_backend(const Params& params, Direction direction, Backend* chosen);

// Bytes of device workspace the call needs (0 for CPU backends and most GPU calls).
Status workspace_size(const Params& params, Direction direction, size_t* bytes);

// ---------------------------------------------------------------------------------------------
// Introspection and names
// ---------------------------------------------------------------------------------------------

struct DeviceInfo {
  Device device;
  std::string name;
  int compute_capability = 0;  // 90 for sm_90; 0 for the CPU
  int multiprocessors = 0;     // CPU: hardware threads
  size_t memory_bytes = 0;
};

// Backends compiled into this build (reference and cpu always).
std::vector<Backend> compiled_backends();
// The CPU and every CUDA device visible to this process.
std::vector<DeviceInfo> devices();

// The `cpu` backend's instruction-set paths (portable, avx2, avx512, avx512bf16): those compiled
// into this build, those of them this CPU runs, and the one calls take now, which is the fastest
// of those unless the environment variable FMHA_CPU_ISA names another. A path that this build or
// this CPU lacks is refused, never run: calls to the cpu backend then fail with `error`.
struct CpuPaths {
  std::vector<std::string> compiled;
  std::vector<std::string> runnable;
  std::string selected;  // empty when FMHA_CPU_ISA is refused
  std::string error;     // why FMHA_CPU_ISA is refused; empty otherwise
};
CpuPaths cpu_paths();

const char* to_string(Backend backend);
const char* to_string(DType dtype);
const char* to_string(Causal causal);
const char* to_string(Precision precision);
const char* to_string(Direction direction);
const char* to_string(Code code);
bool parse(const std::string& text, Backend* out);
bool parse(const std::string& text, DType* out);
bool parse(const std::string& text, Causal* out);

}  // namespace fmha
