// The sequence one block of a simt or sm80 kernel works on. Each kernel is compiled twice: for
// dense calls it reads its parameter block as it is, with the batch index as the start on both
// sides; for packed (variable-length) calls it narrows a copy of the block to its sequence
// (args.h enter_sequence). Two kernels rather than one runtime branch, because the copy's
// narrowed fields live in registers for the whole kernel, which the dense kernels must not pay.
#pragma once

#include <type_traits>

#include "cuda/common/args.h"
#include "fmha/fmha.h"

namespace fmha::cuda {

template <bool kPacked>
struct BlockSequence;

template <>
struct BlockSequence<false> {
  const AttentionArgs& args;
  SequenceStart start;
  __device__ __forceinline__ explicit BlockSequence(const AttentionArgs& call)
      : args(call), start{int64_t(blockIdx.z), int64_t(blockIdx.z)} {}
};

template <>
struct BlockSequence<true> {
  AttentionArgs args;  // the call narrowed to the sequence of batch index blockIdx.z
  SequenceStart start;
  __device__ __forceinline__ explicit BlockSequence(const AttentionArgs& call)
      : args(call), start(args.enter_sequence(blockIdx.z)) {}
};

// launch(std::bool_constant<kPacked>{}) for the call's layout: the launchers' choice between a
// kernel's dense and packed instantiations.
template <class Launch>
Status with_packing(const AttentionArgs& args, Launch&& launch) {
  return args.is_packed() ? launch(std::true_type{}) : launch(std::false_type{});
}

}  // namespace fmha::cuda
