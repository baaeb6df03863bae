// The sequence one block of a simt or sm80 kernel works on: where its rows start (SequenceStart)
// and its mask, which carries its lengths. Each kernel is compiled twice. The dense instantiation
// reads the call's mask and lengths from its parameter block, as it always did; the packed one
// reads the block's sequence from the tables (args.h sequence()) and keeps its mask in registers.
// Two kernels rather than one runtime branch, so that the dense kernels pay no register for what
// only packed calls need (docs/PERF.md, "Variable-length batches").
#pragma once

#include <type_traits>

#include "cuda/common/args.h"
#include "fmha/fmha.h"

namespace fmha::cuda {

template <bool kPacked>
class BlockSequence;

template <>
class BlockSequence<false> {
 public:
  __device__ __forceinline__ explicit BlockSequence(const AttentionArgs& args) : args_(args) {}
  __device__ __forceinline__ SequenceStart start() const { return {int64_t(blockIdx.z), int64_t(blockIdx.z)}; }
  __device__ __forceinline__ const Mask& mask() const { return args_.mask; }

 private:
  const AttentionArgs& args_;
};

template <>
class BlockSequence<true> {
 public:
  __device__ __forceinline__ explicit BlockSequence(const AttentionArgs& args) : seq_(args.sequence(blockIdx.z)) {}
  __device__ __forceinline__ SequenceStart start() const { return seq_.start; }
  __device__ __forceinline__ const Mask& mask() const { return seq_.mask; }

 private:
  Sequence seq_;
};

// launch(std::bool_constant<kPacked>{}) for the call's layout: the launchers' choice between a
// kernel's dense and packed instantiations.
template <class Launch>
Status with_packing(const AttentionArgs& args, Launch&& launch) {
  return args.is_packed() ? launch(std::true_type{}) : launch(std::false_type{});
}

}  // namespace fmha::cuda
