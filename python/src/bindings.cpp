// fmha._C: the Python binding, a thin layer over include/fmha/fmha.h. Arrays arrive through
// DLPack (nanobind ndarray) from any framework; the Python package (python/fmha) allocates the
// outputs and any workspace with the caller's framework and passes them in, so this module never
// owns memory except for the device buffers it hands to JAX (CUDA builds only).
//
// Errors become Python exceptions carrying the C++ message, which names the argument:
//   invalid_argument, unsupported            -> ValueError
//   wrong type or dtype (checked here)       -> TypeError
//   no_device, cuda_error, internal          -> RuntimeError
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#ifndef FMHA_PYTHON_CUDA
#define FMHA_PYTHON_CUDA 0
#endif
#if FMHA_PYTHON_CUDA
#include <cuda_runtime.h>
#endif

#include "fmha/fmha.h"
#include "fmha/tune.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using InputArray = nb::ndarray<nb::ro>;
using OutputArray = nb::ndarray<>;
using DLCode = nb::dlpack::dtype_code;

[[noreturn]] void raise_type(const std::string& message) { throw nb::type_error(message.c_str()); }
[[noreturn]] void raise_value(const std::string& message) { throw nb::value_error(message.c_str()); }

void check(const fmha::Status& status) {
  if (status.ok()) return;
  // The C++ API calls the output `o`; Python calls it `out`.
  const std::string message = status.message.rfind("o: ", 0) == 0 ? "out" + status.message.substr(1) : status.message;
  switch (status.code) {
    case fmha::Code::invalid_argument:
    case fmha::Code::unsupported: raise_value(message);
    default: throw std::runtime_error(message);
  }
}

// call(), an fmha function that returns a Status, with the GIL released (other Python threads
// run meanwhile), then its error raised.
template <class Call>
void check_without_gil(Call&& call) {
  fmha::Status status;
  {
    nb::gil_scoped_release released;
    status = call();
  }
  check(status);
}

std::string dtype_name(nb::dlpack::dtype d) {
  std::string kind;
  switch (DLCode(d.code)) {
    case DLCode::Int: kind = "int"; break;
    case DLCode::UInt: kind = "uint"; break;
    case DLCode::Float: kind = "float"; break;
    case DLCode::Bfloat: kind = "bfloat"; break;
    case DLCode::Complex: kind = "complex"; break;
    case DLCode::Bool: return "bool";
    default: kind = "dlpack_code" + std::to_string(int(d.code)) + "_"; break;
  }
  std::string name = kind + std::to_string(int(d.bits));
  if (d.lanes != 1) name += "x" + std::to_string(int(d.lanes));
  return name;
}

const char* dtype_name(fmha::DType d) {
  switch (d) {
    case fmha::DType::fp32: return "float32";
    case fmha::DType::fp16: return "float16";
    case fmha::DType::bf16: return "bfloat16";
    case fmha::DType::int32: return "int32";
  }
  return "unknown";
}

std::string object_type_name(nb::handle obj) { return nb::type_name(obj.type()).c_str(); }

// The view of an imported array. `raw_bf16`: 16-bit integer arrays carry bfloat16 bits (NumPy
// has no bfloat16 that DLPack can export, so the Python layer passes ml_dtypes arrays that way).
// `table`: the array is a varlen sequence table, which must be int32 (and nothing else may be).
template <class Array>
fmha::Tensor to_tensor(const Array& a, const std::string& name, int rank, bool raw_bf16, bool table = false) {
  fmha::Tensor t;
  const nb::dlpack::dtype d = a.dtype();
  if (table) {
    if (!(d.lanes == 1 && d.bits == 32 && d.code == uint8_t(DLCode::Int)))
      raise_type(name + ": dtype " + dtype_name(d) + " is not supported; expected int32");
    t.dtype = fmha::DType::int32;
  } else if (d.lanes == 1 && d.bits == 32 && d.code == uint8_t(DLCode::Float)) t.dtype = fmha::DType::fp32;
  else if (d.lanes == 1 && d.bits == 16 && d.code == uint8_t(DLCode::Float)) t.dtype = fmha::DType::fp16;
  else if (d.lanes == 1 && d.bits == 16 && d.code == uint8_t(DLCode::Bfloat)) t.dtype = fmha::DType::bf16;
  else if (raw_bf16 && d.lanes == 1 && d.bits == 16 &&
           (d.code == uint8_t(DLCode::UInt) || d.code == uint8_t(DLCode::Int)))
    t.dtype = fmha::DType::bf16;
  else
    raise_type(name + ": dtype " + dtype_name(d) + " is not supported; expected float32, float16 or bfloat16");

  switch (a.device_type()) {
    case nb::device::cpu::value:
    case nb::device::cuda_host::value: t.device = {fmha::DeviceType::cpu, 0}; break;
    case nb::device::cuda::value:
    case nb::device::cuda_managed::value: t.device = {fmha::DeviceType::cuda, a.device_id()}; break;
    default:
      raise_value(name + ": arrays on DLPack device type " + std::to_string(a.device_type()) +
                  " are not supported; expected CPU or CUDA memory");
  }

  const int ndim = int(a.ndim());
  if (ndim > fmha::kMaxRank)
    raise_value(name + ": expected a " + std::to_string(rank) + "-d array, got " + std::to_string(ndim) + "-d");
  t.rank = ndim;
  bool empty = false;
  for (int i = 0; i < ndim; ++i) {
    t.shape[i] = int64_t(a.shape(i));
    t.stride[i] = a.stride(i);
    empty = empty || t.shape[i] == 0;
  }
  if (empty) {  // strides of an empty array mean nothing (exporters report 0 or anything)
    int64_t stride = 1;
    for (int i = ndim - 1; i >= 0; --i) {
      t.stride[i] = stride;
      stride *= t.shape[i] > 0 ? t.shape[i] : 1;
    }
  }
  t.data = const_cast<void*>(static_cast<const void*>(a.data()));
  return t;
}

fmha::Tensor import_input(nb::handle obj, const char* name, int rank, bool raw_bf16, InputArray& slot) {
  if (!nb::try_cast(obj, slot, false))
    raise_type(std::string(name) + ": expected an array (NumPy, PyTorch, CuPy, JAX or any DLPack " +
               "object), got " + object_type_name(obj));
  return to_tensor(slot, name, rank, raw_bf16);
}

fmha::Tensor import_output(nb::handle obj, const char* name, int rank, bool raw_bf16, OutputArray& slot) {
  if (!nb::try_cast(obj, slot, false)) {
    InputArray read_only;
    if (nb::try_cast(obj, read_only, false))
      raise_value(std::string(name) + ": the array is read-only, but fmha writes its result there");
    raise_type(std::string(name) + ": expected a writable array (NumPy, PyTorch, CuPy, JAX or any " +
               "DLPack object), got " + object_type_name(obj));
  }
  return to_tensor(slot, name, rank, raw_bf16);
}

// The sequence tables and longest lengths of a varlen call (all None/0 for a dense one).
struct VarlenArgs {
  nb::handle cu_seqlens_q, cu_seqlens_k;
  int64_t max_seqlen_q = 0, max_seqlen_k = 0;
  bool varlen() const { return !cu_seqlens_q.is_none() || !cu_seqlens_k.is_none(); }
};

void import_tables(const VarlenArgs& args, fmha::Params& p, InputArray& qa, InputArray& ka) {
  if (!args.varlen()) return;
  if (args.cu_seqlens_q.is_none() || args.cu_seqlens_k.is_none())
    raise_value("cu_seqlens_q, cu_seqlens_k: a variable-length call needs both tables");
  for (auto [obj, name, slot, out] : {std::tuple{args.cu_seqlens_q, "cu_seqlens_q", &qa, &p.cu_seqlens_q},
                                      std::tuple{args.cu_seqlens_k, "cu_seqlens_k", &ka, &p.cu_seqlens_k}}) {
    if (!nb::try_cast(obj, *slot, false))
      raise_type(std::string(name) + ": expected an int32 array, got " + object_type_name(obj));
    *out = to_tensor(*slot, name, 1, false, true);
  }
  p.max_seqlen_q = args.max_seqlen_q;
  p.max_seqlen_k = args.max_seqlen_k;
}

// An int32 table of a KV cache (block_table, cache_seqlens), or nothing for None.
fmha::Tensor import_int_table(nb::handle obj, const char* name, int rank, InputArray& slot) {
  if (obj.is_none()) return {};
  if (!nb::try_cast(obj, slot, false))
    raise_type(std::string(name) + ": expected an int32 array, got " + object_type_name(obj));
  return to_tensor(slot, name, rank, false, true);
}

void check_dtype_like_q(const fmha::Tensor& t, const char* name, const fmha::Tensor& q) {
  if (t.defined() && t.dtype != q.dtype)
    raise_type(std::string(name) + ": dtype is " + dtype_name(t.dtype) + ", expected " + dtype_name(q.dtype) +
               " like q");
}

void check_lse_dtype(const fmha::Tensor& lse) {
  if (lse.defined() && lse.dtype != fmha::DType::fp32)
    raise_type(std::string("lse: dtype is ") + dtype_name(lse.dtype) + ", expected float32");
}

// Call options shared by forward, backward and the queries.
struct Options {
  double scale = 0.0;
  int causal = 0;
  int64_t window_left = -1, window_right = -1, q_offset = 0;
  int precision = 0;
  bool deterministic = false;
  std::string backend = "auto";
  uintptr_t stream = 0;
  int num_threads = 0;
  int num_splits = 0;
};

void apply(const Options& o, fmha::Params& p) {
  p.softmax_scale = float(o.scale);
  if (o.causal < 0 || o.causal > 2) raise_value("causal: expected None, 'top-left' or 'bottom-right'");
  p.causal = fmha::Causal(o.causal);
  p.window_left = o.window_left;
  p.window_right = o.window_right;
  p.q_offset = o.q_offset;
  if (o.precision < 0 || o.precision > int(fmha::Precision::tf32x3))
    raise_value("precision: expected None, 'ieee', 'tf32' or 'tf32x3'");
  p.precision = fmha::Precision(o.precision);
  p.deterministic = o.deterministic;
  if (!fmha::parse(o.backend, &p.backend))
    raise_value("backend: unknown backend '" + o.backend + "'; expected auto, reference, cpu, simt, sm80 or sm90");
  p.stream = reinterpret_cast<void*>(o.stream);
  p.num_threads = o.num_threads;
  p.num_splits = o.num_splits;
}

// Attaches the caller's workspace (any contiguous array on q's device) to the call. Returns the
// bytes the call needs when that is more than it was given (the call must then not run).
size_t attach_workspace(fmha::Params& p, fmha::Direction direction, nb::handle workspace, OutputArray& slot) {
  if (p.q.device.type != fmha::DeviceType::cuda) return 0;  // CPU backends need none
  size_t needed = 0;
  check(fmha::workspace_size(p, direction, &needed));
  if (!workspace.is_none()) {
    if (!nb::try_cast(workspace, slot, false))
      raise_type("workspace: expected a writable array, got " + object_type_name(workspace));
    const bool on_q_device = slot.device_type() == nb::device::cuda::value && slot.device_id() == p.q.device.index;
    if (!on_q_device) raise_value("workspace: must be on the same device as q");
    if (slot.ndim() != 1 || (slot.shape(0) > 1 && slot.stride(0) != 1))
      raise_value("workspace: expected a contiguous 1-d array");
    p.workspace = slot.data();
    p.workspace_bytes = slot.nbytes();
  }
  return needed > p.workspace_bytes ? needed : 0;
}

// The options applied and the workspace attached, the call in `direction` without the GIL.
// Returns 0 when it ran, else the workspace bytes it needs (more than it was given; nothing ran).
int64_t run(fmha::Params& p, const Options& options, fmha::Direction direction, nb::handle workspace,
            OutputArray& workspace_slot) {
  apply(options, p);
  if (size_t needed = attach_workspace(p, direction, workspace, workspace_slot)) return int64_t(needed);
  check_without_gil([&] { return direction == fmha::Direction::forward ? fmha::forward(p) : fmha::backward(p); });
  return 0;
}

int64_t forward(nb::handle q, nb::handle k, nb::handle v, nb::handle o, nb::handle lse, nb::handle workspace,
                const Options& options, bool raw_bf16, nb::handle cu_seqlens_q, nb::handle cu_seqlens_k,
                int64_t max_seqlen_q, int64_t max_seqlen_k, nb::handle block_table, nb::handle cache_seqlens) {
  const VarlenArgs varlen{cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k};
  InputArray qa, ka, va, cqa, cka, bta, csa;
  OutputArray oa, la, wa;
  fmha::Params p;
  const int rank = varlen.varlen() ? 3 : 4;
  p.q = import_input(q, "q", rank, raw_bf16, qa);
  p.k = import_input(k, "k", rank, raw_bf16, ka);
  p.v = import_input(v, "v", rank, raw_bf16, va);
  p.o = import_output(o, "out", rank, raw_bf16, oa);
  import_tables(varlen, p, cqa, cka);
  p.block_table = import_int_table(block_table, "block_table", 2, bta);
  p.cache_seqlens = import_int_table(cache_seqlens, "cache_seqlens", 1, csa);
  check_dtype_like_q(p.k, "k", p.q);
  check_dtype_like_q(p.v, "v", p.q);
  check_dtype_like_q(p.o, "out", p.q);
  if (!lse.is_none()) {
    p.lse = import_output(lse, "lse", rank - 1, false, la);
    check_lse_dtype(p.lse);
  }
  return run(p, options, fmha::Direction::forward, workspace, wa);
}

int64_t backward(nb::handle q, nb::handle k, nb::handle v, nb::handle o, nb::handle dout, nb::handle lse,
                 nb::handle dq, nb::handle dk, nb::handle dv, nb::handle workspace, const Options& options,
                 bool raw_bf16, nb::handle cu_seqlens_q, nb::handle cu_seqlens_k, int64_t max_seqlen_q,
                 int64_t max_seqlen_k) {
  const VarlenArgs varlen{cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k};
  InputArray qa, ka, va, oa, da, la, cqa, cka;
  OutputArray dqa, dka, dva, wa;
  fmha::Params p;
  const int rank = varlen.varlen() ? 3 : 4;
  p.q = import_input(q, "q", rank, raw_bf16, qa);
  p.k = import_input(k, "k", rank, raw_bf16, ka);
  p.v = import_input(v, "v", rank, raw_bf16, va);
  p.o = import_input(o, "out", rank, raw_bf16, oa);
  p.dout = import_input(dout, "dout", rank, raw_bf16, da);
  p.lse = import_input(lse, "lse", rank - 1, false, la);
  p.dq = import_output(dq, "dq", rank, raw_bf16, dqa);
  p.dk = import_output(dk, "dk", rank, raw_bf16, dka);
  p.dv = import_output(dv, "dv", rank, raw_bf16, dva);
  import_tables(varlen, p, cqa, cka);
  check_dtype_like_q(p.k, "k", p.q);
  check_dtype_like_q(p.v, "v", p.q);
  check_dtype_like_q(p.o, "out", p.q);
  check_dtype_like_q(p.dout, "dout", p.q);
  check_dtype_like_q(p.dq, "dq", p.q);
  check_dtype_like_q(p.dk, "dk", p.q);
  check_dtype_like_q(p.dv, "dv", p.q);
  check_lse_dtype(p.lse);
  return run(p, options, fmha::Direction::backward, workspace, wa);
}

// fmha::merge into `out` / `lse` (which may be out_a / lse_a: the accumulate form).
void merge(nb::handle out_a, nb::handle lse_a, nb::handle out_b, nb::handle lse_b, nb::handle out, nb::handle lse,
           uintptr_t stream, int num_threads, bool raw_bf16) {
  InputArray oa, la, ob, lb;
  OutputArray o, l;
  fmha::MergeParams m;
  // The rank is the layout's (checked by fmha::merge); it only words the error of a 5-d array here.
  m.out_a = import_input(out_a, "out_a", 4, raw_bf16, oa);
  m.lse_a = import_input(lse_a, "lse_a", 3, false, la);
  m.out_b = import_input(out_b, "out_b", 4, raw_bf16, ob);
  m.lse_b = import_input(lse_b, "lse_b", 3, false, lb);
  m.out = import_output(out, "out", 4, raw_bf16, o);
  m.lse = import_output(lse, "lse", 3, false, l);
  m.stream = reinterpret_cast<void*>(stream);
  m.num_threads = num_threads;
  check_without_gil([&] { return fmha::merge(m); });
}

// fmha::append_kv: k_new / v_new written into the cache k / v at each sequence's length.
void append_kv(nb::handle k, nb::handle v, nb::handle k_new, nb::handle v_new, nb::handle block_table,
               nb::handle cache_seqlens, uintptr_t stream, int num_threads, bool raw_bf16) {
  OutputArray ka, va;
  InputArray kna, vna, bta, csa;
  fmha::Params p;
  p.k = import_output(k, "k_cache", 4, raw_bf16, ka);
  p.v = import_output(v, "v_cache", 4, raw_bf16, va);
  p.k_new = import_input(k_new, "k", 4, raw_bf16, kna);
  p.v_new = import_input(v_new, "v", 4, raw_bf16, vna);
  p.block_table = import_int_table(block_table, "block_table", 2, bta);
  p.cache_seqlens = import_int_table(cache_seqlens, "cache_seqlens", 1, csa);
  p.stream = reinterpret_cast<void*>(stream);
  p.num_threads = num_threads;
  check_without_gil([&] { return fmha::append_kv(p); });
}

// Times fmha::forward alone (no Python, no argument conversion) on the given arrays: the
// seconds of each of `iterations` calls. For measuring the binding's overhead.
std::vector<double> time_forward(nb::handle q, nb::handle k, nb::handle v, nb::handle o, nb::handle lse,
                                 const Options& options, int iterations) {
  InputArray qa, ka, va;
  OutputArray oa, la;
  fmha::Params p;
  p.q = import_input(q, "q", 4, false, qa);
  p.k = import_input(k, "k", 4, false, ka);
  p.v = import_input(v, "v", 4, false, va);
  p.o = import_output(o, "out", 4, false, oa);
  if (!lse.is_none()) p.lse = import_output(lse, "lse", 3, false, la);
  apply(options, p);
  if (p.q.device.type != fmha::DeviceType::cpu) raise_value("q: time_forward times CPU calls only");
  std::vector<double> seconds;
  seconds.reserve(size_t(iterations > 0 ? iterations : 0));
  nb::gil_scoped_release released;
  for (int i = 0; i < iterations; ++i) {
    const auto start = std::chrono::steady_clock::now();
    const fmha::Status status = fmha::forward(p);
    const auto stop = std::chrono::steady_clock::now();
    if (!status.ok()) {
      nb::gil_scoped_acquire acquired;
      check(status);
    }
    seconds.push_back(std::chrono::duration<double>(stop - start).count());
  }
  return seconds;
}

// A contiguous view of `shape` like `like` at an address that is never dereferenced: queries
// (supports, select_backend, workspace_size) look at shapes, dtypes and devices only.
fmha::Tensor shape_only(const fmha::Tensor& like, std::initializer_list<int64_t> shape, fmha::DType dtype) {
  alignas(64) static unsigned char never_read[64];
  return fmha::make_tensor(never_read, dtype, shape, like.device);
}

// Builds the Params of a call from q, k, v alone, for the queries.
fmha::Params query_params(nb::handle q, nb::handle k, nb::handle v, const Options& options, bool raw_bf16,
                          InputArray& qa, InputArray& ka, InputArray& va) {
  fmha::Params p;
  p.q = import_input(q, "q", 4, raw_bf16, qa);
  p.k = import_input(k, "k", 4, raw_bf16, ka);
  p.v = import_input(v, "v", 4, raw_bf16, va);
  check_dtype_like_q(p.k, "k", p.q);
  check_dtype_like_q(p.v, "v", p.q);
  apply(options, p);
  if (p.q.rank == 4 && p.k.rank == 4 && p.v.rank == 4) {
    const int64_t b = p.q.shape[0], sq = p.q.shape[1], h = p.q.shape[2], d = p.q.shape[3];
    const int64_t dv = p.v.shape[3];
    p.o = shape_only(p.q, {b, sq, h, dv}, p.q.dtype);
    p.dout = p.o;
    p.lse = shape_only(p.q, {b, h, sq}, fmha::DType::fp32);
    p.dq = shape_only(p.q, {b, sq, h, d}, p.q.dtype);
    p.dk = shape_only(p.k, {p.k.shape[0], p.k.shape[1], p.k.shape[2], p.k.shape[3]}, p.q.dtype);
    p.dv = shape_only(p.v, {p.v.shape[0], p.v.shape[1], p.v.shape[2], dv}, p.q.dtype);
  }
  return p;
}

fmha::Direction parse_direction(const std::string& direction) {
  if (direction == "forward" || direction == "fwd") return fmha::Direction::forward;
  if (direction == "backward" || direction == "bwd") return fmha::Direction::backward;
  raise_value("direction: expected 'forward' or 'backward', got '" + direction + "'");
}

// (backend name, "") when the call can run, (None, reason) when it cannot.
nb::tuple select_backend(const std::string& direction, nb::handle q, nb::handle k, nb::handle v,
                         const Options& options, bool raw_bf16) {
  InputArray qa, ka, va;
  const fmha::Params p = query_params(q, k, v, options, raw_bf16, qa, ka, va);
  fmha::Backend chosen{};
  const fmha::Status status = fmha::select_backend(p, parse_direction(direction), &chosen);
  if (status.code == fmha::Code::unsupported || status.code == fmha::Code::no_device)
    return nb::make_tuple(nb::none(), status.message);
  check(status);
  return nb::make_tuple(nb::str(fmha::to_string(chosen)), nb::str(""));
}

size_t workspace_size(const std::string& direction, nb::handle q, nb::handle k, nb::handle v,
                      const Options& options, bool raw_bf16) {
  InputArray qa, ka, va;
  const fmha::Params p = query_params(q, k, v, options, raw_bf16, qa, ka, va);
  size_t bytes = 0;
  check(fmha::workspace_size(p, parse_direction(direction), &bytes));
  return bytes;
}

// fmha::tune on the class of a call on these arrays (their data are not read): the winner and
// each variant's time, as a dict.
nb::dict tune(const std::string& direction, nb::handle q, nb::handle k, nb::handle v, const Options& options,
              bool raw_bf16, int warmup, int iters, bool write_cache) {
  InputArray qa, ka, va;
  const fmha::Params p = query_params(q, k, v, options, raw_bf16, qa, ka, va);
  fmha::TuneOptions tune_options;
  tune_options.warmup = warmup;
  tune_options.iters = iters;
  tune_options.write_cache = write_cache;
  fmha::TuneResult r;
  check_without_gil([&] { return fmha::tune(p, parse_direction(direction), tune_options, &r); });
  nb::dict out;
  out["problem_class"] = r.problem.key();
  out["device"] = r.device;
  out["default"] = r.default_variant;
  out["winner"] = r.winner;
  out["default_ms"] = r.default_ms;
  out["winner_ms"] = r.winner_ms;
  nb::list variants;
  for (const fmha::VariantTiming& t : r.variants) {
    nb::dict entry;
    entry["variant"] = t.variant;
    entry["is_default"] = t.is_default;
    entry["agrees"] = t.agrees;
    entry["ms"] = t.ms;
    entry["difference"] = t.difference;
    entry["status"] = t.status;
    variants.append(entry);
  }
  out["variants"] = variants;
  return out;
}

// What a call on these arrays runs (fmha::selected_variant): its variant and why, its precision.
fmha::VariantChoice variant_choice(const std::string& direction, nb::handle q, nb::handle k, nb::handle v,
                                   const Options& options, bool raw_bf16) {
  InputArray qa, ka, va;
  const fmha::Params p = query_params(q, k, v, options, raw_bf16, qa, ka, va);
  fmha::VariantChoice choice;
  check(fmha::selected_variant(p, parse_direction(direction), &choice));
  return choice;
}

// (variant, source) of the call on these arrays: ("", "") for a backend without variants.
nb::tuple selected_variant(const std::string& direction, nb::handle q, nb::handle k, nb::handle v,
                           const Options& options, bool raw_bf16) {
  const fmha::VariantChoice choice = variant_choice(direction, q, k, v, options, raw_bf16);
  return nb::make_tuple(choice.variant, choice.source);
}

// The arithmetic a call on these arrays runs in (fmha::VariantChoice::precision): "ieee", "tf32"
// or "tf32x3".
std::string computed_precision(const std::string& direction, nb::handle q, nb::handle k, nb::handle v,
                               const Options& options, bool raw_bf16) {
  return fmha::to_string(variant_choice(direction, q, k, v, options, raw_bf16).precision);
}

void clear_tune_cache() { check(fmha::clear_tune_cache()); }

nb::dict info() {
  nb::dict out;
  out["version"] = fmha::version();
  nb::list backends;
  for (fmha::Backend b : fmha::compiled_backends()) backends.append(fmha::to_string(b));
  out["backends"] = backends;
  nb::list devices;
  for (const fmha::DeviceInfo& d : fmha::devices()) {
    nb::dict entry;
    entry["device"] = d.device.type == fmha::DeviceType::cpu ? std::string("cpu")
                                                              : "cuda:" + std::to_string(d.device.index);
    entry["name"] = d.name;
    entry["compute_capability"] = d.compute_capability;
    entry["multiprocessors"] = d.multiprocessors;
    entry["memory_bytes"] = d.memory_bytes;
    devices.append(entry);
  }
  out["devices"] = devices;
  out["cuda"] = bool(FMHA_PYTHON_CUDA);
  return out;
}

#if FMHA_PYTHON_CUDA
void check_cuda(cudaError_t error, const char* what) {
  if (error != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(error));
}

// An uninitialised device array owned by Python: freed (cudaFree) when its last reference,
// e.g. the JAX array imported from it through DLPack, goes away.
// Returned as an array-API object (with __dlpack__ and __dlpack_device__, importable any number
// of times), not a one-shot DLPack capsule: it is both fmha's output and what JAX imports.
nb::ndarray<nb::array_api> cuda_empty(const std::vector<int64_t>& shape, const std::string& dtype, int device) {
  nb::dlpack::dtype d{};
  if (dtype == "float32") d = nb::dtype<float>();
  else if (dtype == "float16") d = {uint8_t(DLCode::Float), 16, 1};
  else if (dtype == "bfloat16") d = {uint8_t(DLCode::Bfloat), 16, 1};
  else if (dtype == "uint8") d = nb::dtype<uint8_t>();
  else raise_type("dtype: expected float32, float16, bfloat16 or uint8, got '" + dtype + "'");
  size_t count = 1;
  std::vector<size_t> extents;
  for (int64_t n : shape) {
    if (n < 0) raise_value("shape: sizes must be >= 0");
    extents.push_back(size_t(n));
    count *= size_t(n);
  }
  const size_t bytes = count * (d.bits / 8);
  int previous = 0;
  check_cuda(cudaGetDevice(&previous), "cudaGetDevice");
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  void* data = nullptr;
  const cudaError_t error = cudaMalloc(&data, bytes > 0 ? bytes : 1);
  cudaSetDevice(previous);
  check_cuda(error, "cudaMalloc");
  nb::capsule owner(data, [](void* p) noexcept { cudaFree(p); });
  return nb::ndarray<nb::array_api>(data, extents.size(), extents.data(), owner, nullptr, d, nb::device::cuda::value,
                                   device);
}

void synchronize(uintptr_t stream) {
  nb::gil_scoped_release released;
  check_cuda(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
}
#endif

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "fmha's compiled core: fused multi-head attention over DLPack arrays";
  // The Python layer caches Options objects in module globals, which may outlive this module at
  // interpreter exit; that is not a leak worth reporting.
  nb::set_leak_warnings(false);

  nb::class_<Options>(m, "Options")
      .def(nb::init<>())
      .def_rw("scale", &Options::scale)
      .def_rw("causal", &Options::causal)
      .def_rw("window_left", &Options::window_left)
      .def_rw("window_right", &Options::window_right)
      .def_rw("q_offset", &Options::q_offset)
      .def_rw("precision", &Options::precision)
      .def_rw("deterministic", &Options::deterministic)
      .def_rw("backend", &Options::backend)
      .def_rw("stream", &Options::stream)
      .def_rw("num_threads", &Options::num_threads)
      .def_rw("num_splits", &Options::num_splits);

  m.def("forward", &forward, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a.none(), "workspace"_a.none(), "options"_a,
        "raw_bf16"_a = false, "cu_seqlens_q"_a.none() = nb::none(), "cu_seqlens_k"_a.none() = nb::none(),
        "max_seqlen_q"_a = 0, "max_seqlen_k"_a = 0, "block_table"_a.none() = nb::none(),
        "cache_seqlens"_a.none() = nb::none(),
        "Runs the forward pass into `out` (and `lse` unless None). Returns 0, or, for a CUDA call "
        "whose workspace is missing or too small, the bytes it needs (nothing runs then).");
  m.def("append_kv", &append_kv, "k"_a, "v"_a, "k_new"_a, "v_new"_a, "block_table"_a.none(), "cache_seqlens"_a,
        "stream"_a = 0, "num_threads"_a = 0, "raw_bf16"_a = false,
        "Writes k_new / v_new into the KV cache k / v at positions cache_seqlens[b] ... (fmha::append_kv).");
  m.def("backward", &backward, "q"_a, "k"_a, "v"_a, "out"_a, "dout"_a, "lse"_a, "dq"_a, "dk"_a, "dv"_a,
        "workspace"_a.none(), "options"_a, "raw_bf16"_a = false, "cu_seqlens_q"_a.none() = nb::none(),
        "cu_seqlens_k"_a.none() = nb::none(), "max_seqlen_q"_a = 0, "max_seqlen_k"_a = 0,
        "Runs the backward pass into dq, dk, dv. Returns like forward().");
  m.def("merge", &merge, "out_a"_a, "lse_a"_a, "out_b"_a, "lse_b"_a, "out"_a, "lse"_a, "stream"_a = 0,
        "num_threads"_a = 0, "raw_bf16"_a = false,
        "Merges two partial results (out, lse) over disjoint key sets into out, lse (fmha::merge).");
  m.def("select_backend", &select_backend, "direction"_a, "q"_a, "k"_a, "v"_a, "options"_a, "raw_bf16"_a = false,
        "The backend a call on these arrays would run: (name, '') or (None, reason).");
  m.def("workspace_size", &workspace_size, "direction"_a, "q"_a, "k"_a, "v"_a, "options"_a, "raw_bf16"_a = false,
        "Bytes of device workspace a call on these arrays needs.");
  m.def("time_forward", &time_forward, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a.none(), "options"_a, "iterations"_a,
        "Seconds taken by each of `iterations` fmha::forward calls on these CPU arrays (C++ only).");
  m.def("info", &info, "Version, compiled backends and visible devices.");
  m.def("tune", &tune, "direction"_a, "q"_a, "k"_a, "v"_a, "options"_a, "raw_bf16"_a, "warmup"_a, "iters"_a,
        "write_cache"_a, "Tunes the class of a call on these arrays (include/fmha/tune.h); a dict of the results.");
  m.def("selected_variant", &selected_variant, "direction"_a, "q"_a, "k"_a, "v"_a, "options"_a, "raw_bf16"_a = false,
        "(variant, source) that a call on these arrays runs; source: variable, cache, default.");
  m.def("computed_precision", &computed_precision, "direction"_a, "q"_a, "k"_a, "v"_a, "options"_a,
        "raw_bf16"_a = false, "The arithmetic a call on these arrays runs in: ieee, tf32 or tf32x3.");
  m.def("set_autotune", &fmha::set_autotune, "enabled"_a, "Autotune the first call of each untuned class.");
  m.def("autotune_enabled", &fmha::autotune_enabled, "Whether autotuning is on.");
  m.def("tune_cache_path", &fmha::tune_cache_path, "The tuning cache file.");
  m.def("clear_tune_cache", &clear_tune_cache, "Removes the tuning cache file.");
#if FMHA_PYTHON_CUDA
  m.def("cuda_empty", &cuda_empty, "shape"_a, "dtype"_a, "device"_a,
        "An uninitialised CUDA array (cudaMalloc), freed when its last reference goes away.");
  m.def("synchronize", &synchronize, "stream"_a, "Waits for a CUDA stream (0: the legacy default stream).");
#endif
}
