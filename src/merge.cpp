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
  const int64_t rows = m.rows(), dim = m.head_dim_v;
  const int64_t items = (rows + kRowsPerItem - 1) / kRowsPerItem;
  parallel_for(items, resolve_threads(threads), [&](int, int64_t item) {
    // [head_dim_v] rows of a, b and the result, fp32. Both inputs are read before the output
    // (which may be one of them) is written.
    std::vector<float> a(static_cast<size_t>(dim)), b(static_cast<size_t>(dim)), out(static_cast<size_t>(dim));
    const int64_t end = std::min(rows, (item + 1) * kRowsPerItem);
    for (int64_t r = item * kRowsPerItem; r < end; ++r) {
      const int64_t h = r % m.heads, s = (r / m.heads) % m.seqlen, batch = r / (m.heads * m.seqlen);
      const float lse_a = static_cast<const float*>(m.lse_a.data)[offset3(m.lse_a, batch, h, s)];
      const float lse_b = static_cast<const float*>(m.lse_b.data)[offset3(m.lse_b, batch, h, s)];
      const MergeWeights w = merge_weights(lse_a, lse_b);
      // A side of weight 0 is not read: it may hold anything (an unstarted accumulator).
      std::fill(out.begin(), out.end(), 0.f);
      if (w.a != 0.f) {
        read_row(m.out_a, offset4(m.out_a, batch, s, h, 0), dim, a.data());
        for (int64_t d = 0; d < dim; ++d) out[size_t(d)] += w.a * a[size_t(d)];
      }
      if (w.b != 0.f) {
        read_row(m.out_b, offset4(m.out_b, batch, s, h, 0), dim, b.data());
        for (int64_t d = 0; d < dim; ++d) out[size_t(d)] += w.b * b[size_t(d)];
      }
      write_row(m.out, offset4(m.out, batch, s, h, 0), dim, out.data());
      static_cast<float*>(m.lse.data)[offset3(m.lse, batch, h, s)] = w.lse;
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
