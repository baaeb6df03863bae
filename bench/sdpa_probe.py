"""A few calls of one PyTorch SDPA backend at one shape of FlashAttention's sweep (16k tokens,
hidden 2048, bf16, non-causal), for a profiler to catch that backend's kernel, e.g.

    ncu --section SpeedOfLight --section MemoryWorkloadAnalysis -k regex:sdpa -s 2 -c 1 \
        python3 bench/sdpa_probe.py 128 512

Arguments: head dim, sequence length, and optionally the backend (cudnn, flash, efficient;
default cudnn). Needs PyTorch with CUDA.
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}
TOKENS, HIDDEN, CALLS = 16384, 2048, 5


def main() -> None:
    head_dim, seqlen = int(sys.argv[1]), int(sys.argv[2])
    backend = BACKENDS[sys.argv[3] if len(sys.argv) > 3 else "cudnn"]
    q, k, v = (torch.randn(TOKENS // seqlen, HIDDEN // head_dim, seqlen, head_dim, device="cuda",
                           dtype=torch.bfloat16) for _ in range(3))
    with sdpa_kernel(backend):
        for _ in range(CALLS):
            F.scaled_dot_product_attention(q, k, v)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
