// The fp64 oracle: the plain definition of attention and its gradient, evaluated in double
// precision from the stored inputs. Every test in fmha measures against it. Results come back
// unrounded in contiguous double arrays so that checks see the exact answer.
#pragma once

#include <cstdint>
#include <vector>

#include "common/problem.h"
#include "fmha/fmha.h"

namespace fmha::reference {

struct ForwardResult {
  std::vector<double> o;    // [batch, seqlen_q, heads, head_dim_v]
  std::vector<double> lse;  // [batch, heads, seqlen_q], natural log; -inf for rows that see no key
};

struct BackwardResult {
  std::vector<double> dq;  // [batch, seqlen_q, heads, head_dim]
  std::vector<double> dk;  // [batch, seqlen_k, kv_heads, head_dim]
  std::vector<double> dv;  // [batch, seqlen_k, kv_heads, head_dim_v]
};

// One query row: o_row[head_dim_v] and its log-sum-exp.
void forward_row(const Params& params, const Problem& problem, int64_t b, int64_t h, int64_t row,
                 double* o_row, double* lse);

// Gradients of the query heads that share KV head `kv_head` of batch `b`:
//   dq[group][seqlen_q][head_dim], dk[seqlen_k][head_dim], dv[seqlen_k][head_dim_v].
void backward_group(const Params& params, const Problem& problem, int64_t b, int64_t kv_head,
                    double* dq, double* dk, double* dv);

ForwardResult forward(const Params& params, int threads = 0);
BackwardResult backward(const Params& params, int threads = 0);

// The `reference` backend: runs the oracle and stores its results in the outputs' dtype.
Status run(const Params& params, Direction direction);

}  // namespace fmha::reference
