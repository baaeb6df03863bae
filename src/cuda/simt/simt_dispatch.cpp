// The simt tier's entry points for the backend table: supports, run, workspace_size. Exact fp32
// (FMA, libdevice exp2f) on any GPU this build has machine code for (sm_75 and up with CUDA 13,
// which dropped the older architectures), fp32 storage and Precision::ieee only.
#include "cuda/simt/simt_dispatch.h"

#include "cuda/common/dispatch_util.h"
#include "cuda/simt/simt_launch.h"

namespace fmha::cuda::simt {

Status supports(const Params& p, Direction direction) {
  const Problem s = Problem::of(p);
  if (FMHA_CUDA_SIMT_MIN_ARCH == 0) return unsupported("backend: the simt tier is not compiled into this build");
  if (p.q.dtype != DType::fp32)
    return unsupported(std::string("q: the simt tier stores fp32 only, got ") + to_string(p.q.dtype) +
                       " (fp16/bf16 run on sm80)");
  if (p.precision != Precision::ieee)
    return unsupported("precision: the simt tier computes exact fp32 (ieee); tf32 runs on sm80");
  int bucket = 0;
  if (Status st = head_dim_of(s, &bucket); !st.ok()) return st;
  if (Status st = check_grid_limits(s); !st.ok()) return st;
  DeviceProps props;
  if (Status st = current_device(p, direction, &props); !st.ok()) return st;
  if (props.arch < FMHA_CUDA_SIMT_MIN_ARCH)
    return unsupported("q: cuda:" + std::to_string(props.ordinal) + " is sm_" + std::to_string(props.arch) +
                       "; this build has simt machine code for FMHA_CUDA_ARCHS = " FMHA_CUDA_ARCHS_TEXT);
  return with_head_dim(bucket, [&](auto hd) {
    constexpr int HD = decltype(hd)::value;
    const size_t need = direction == Direction::forward ? forward_shared_bytes<HD>() : backward_shared_bytes<HD>();
    return check_shared_memory("simt", direction, HD, need, props);
  });
}

Status workspace_size(const Params& p, Direction direction, size_t* bytes) {
  *bytes = direction == Direction::backward ? workspace_layout(Problem::of(p), p.deterministic).total : 0;
  return Status::success();
}

Status run(const Params& p, Direction direction) {
  if (Status st = simt::supports(p, direction); !st.ok()) return st;
  const Problem s = Problem::of(p);
  AttentionArgs args = make_args(p, s);
  if (direction == Direction::backward) {
    if (Status st = bind_workspace(p, workspace_layout(s, p.deterministic), &args); !st.ok()) return st;
  }
  const auto stream = static_cast<cudaStream_t>(p.stream);
  return with_head_dim(head_dim_bucket(s.head_dim, s.head_dim_v), [&](auto hd) {
    constexpr int HD = decltype(hd)::value;
    return direction == Direction::forward ? forward<HD>(args, stream) : backward<HD>(args, stream);
  });
}

}  // namespace fmha::cuda::simt
