// fmha::merge: partial attention results over disjoint key sets combined into one, on the CPU
// here and on CUDA tensors through src/cuda/merge.cu. The per-row math is common/merge.h's.
#include <algorithm>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "backends.h"
#include "common/merge.h"
#include "common/numeric.h"
#include "common/parallel.h"
#include "common/tensor_access.h"

namespace fmha {
namespace {

// Rows of one work item: enough that a thread's start-up is paid back, few enough to balance.
constexpr int64_t kRowsPerItem = 256;

void merge_cpu(const MergeRows& m, int threads) {
  const int64_t rows = m.rows();
  const int64_t items = (rows + kRowsPerItem - 1) / kRowsPerItem;
  parallel_for(items, resolve_threads(threads), [&](int, int64_t item) {
    std::vector<float> row(size_t(m.head_dim_v));
    const int64_t end = std::min(rows, (item + 1) * kRowsPerItem);
    for (int64_t r = item * kRowsPerItem; r < end; ++r) {
      const int64_t h = r % m.heads, s = (r / m.heads) % m.seqlen, b = r / (m.heads * m.seqlen);
      const float lse_a = static_cast<const float*>(m.lse_a.data)[offset3(m.lse_a, b, h, s)];
      const float lse_b = static_cast<const float*>(m.lse_b.data)[offset3(m.lse_b, b, h, s)];
      const MergeWeights w = merge_weights(lse_a, lse_b);
      // [head_dim_v] merged row, fp32; both inputs are read before the output (which may be one of them) is written
      for (int64_t d = 0; d < m.head_dim_v; ++d) {
        float x = 0.f;
        if (w.a != 0.f) x += w.a * load_element(m.out_a.data, m.out_a.dtype, offset4(m.out_a, b, s, h, d));
        if (w.b != 0.f) x += w.b * load_element(m.out_b.data, m.out_b.dtype, offset4(m.out_b, b, s, h, d));
        row[size_t(d)] = x;
      }
      for (int64_t d = 0; d < m.head_dim_v; ++d)
        store_element(m.out.data, m.out.dtype, offset4(m.out, b, s, h, d), row[size_t(d)]);
      static_cast<float*>(m.lse.data)[offset3(m.lse, b, h, s)] = w.lse;
    }
  });
}

}  // namespace

Status merge(const MergeParams& params) {
  MergeRows rows;
  if (Status s = detail::validate_merge(params, &rows); !s.ok()) return s;
  if (params.num_threads < 0)
    return {Code::invalid_argument, "num_threads: is " + std::to_string(params.num_threads) + ", expected >= 0"};
  if (rows.rows() == 0) return Status::success();
  if (params.out_a.device.type == DeviceType::cuda) return detail::cuda_merge(rows, params.stream);
  try {
    merge_cpu(rows, params.num_threads);
  } catch (const std::bad_alloc&) {
    return {Code::internal, "merge: out of host memory"};
  } catch (const std::exception& e) {
    return {Code::internal, std::string("merge: ") + e.what()};
  }
  return Status::success();
}

Status merge_into(const Tensor& acc_out, const Tensor& acc_lse, const Tensor& part_out, const Tensor& part_lse,
                  void* stream) {
  MergeParams p;
  p.out_a = acc_out;
  p.lse_a = acc_lse;
  p.out_b = part_out;
  p.lse_b = part_lse;
  p.out = acc_out;
  p.lse = acc_lse;
  p.stream = stream;
  return merge(p);
}

}  // namespace fmha
