// The storage tag of split-tf32 (Precision::tf32x3) kernels, visible to host dispatch code too.
#pragma once

namespace fmha::cuda::tile {

// fp32 storage whose matmuls run as split tf32: the bytes of one float, in a type of its own so
// that a kernel's element type picks the three-product mma (mma.cuh MmaOp<tf32x3>) and the
// high/residual operand fragments (convert.cuh set_operand). Tensors hold plain fp32.
struct tf32x3 {
  float value;
};
static_assert(sizeof(tf32x3) == sizeof(float), "tf32x3 is stored as fp32");

}  // namespace fmha::cuda::tile
