// The sm90 backward's kernel parameters: the argument block plus the TMA maps of the inputs it
// reads in tiles (encoded on the host per call). Passed as one __grid_constant__ parameter.
#pragma once

#include <cuda.h>

#include "cuda/common/args.h"
#include "cuda/sm90/sm90_bwd_blocks.h"

namespace fmha::cuda::sm90 {

struct BwdParams {
  CUtensorMap q;     // [B, Sq, H, D]: boxes of 64 columns × BwdConfig::rows rows
  CUtensorMap k;     // [B, Sk, Hkv, D]: 64 × keys per block (BwdConfig::keys: 128, or 64 above 128)
  CUtensorMap v;     // [B, Sk, Hkv, Dv]: 64 × keys per block
  CUtensorMap dout;  // [B, Sq, H, Dv]: 64 × BwdConfig::rows
  AttentionArgs args;
  // dK and dV rows 16-byte aligned and whole 16-byte vectors: the epilogue stages each block's
  // tiles in shared memory and writes them in 16-byte vectors (else from registers, two columns
  // at a time).
  bool vector_key_grads = false;
  BwdBlockOrder order;  // the 1-D grid's blocks
};

}  // namespace fmha::cuda::sm90
