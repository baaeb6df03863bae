"""A model of split-tf32 dV = P^T·dO summed on tensor cores, against fp64 and a naive fp32 sum.

The split-tf32 backward forms each product from three tensor-core products (hi·hi, hi·lo, lo·hi);
a tensor core adds a k-step's products into its fp32 accumulator with fewer bits than fp32's
round-to-nearest (modelled here: the exact sum of the step rounded toward zero to fp32). Added
straight into dV over every query row of a long sequence, that loss accumulates; formed from zero
over a step of 16 rows and then added to dV in fp32, it does not.

    python docs/perf/split_tf32_accumulation_model.py

prints, per (query rows, keys): the max |error| of the naive fp32 sum, of the straight
tensor-core chain and of the per-step form (docs/PERF.md quotes one run).
"""
import numpy as np


def fp32_toward_zero(x):
    y = x.astype(np.float32)
    over = np.abs(y.astype(np.float64)) > np.abs(x)
    y[over] = np.nextafter(y[over], np.float32(0))
    return y


def tf32(x):
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x1000) & 0xFFFFE000).astype(np.uint32).view(np.float32)


def split(x):
    hi = tf32(x)
    return hi, tf32((x.astype(np.float32) - hi).astype(np.float32))


def tensor_core_sum(p, d_out, step_rows, per_step):
    p_hi, p_lo = split(p)
    d_hi, d_lo = split(d_out)
    acc = np.zeros((p.shape[1], d_out.shape[1]), np.float32)
    for s0 in range(0, p.shape[0], step_rows):
        part = np.zeros_like(acc) if per_step else acc
        for k0 in range(s0, min(s0 + step_rows, p.shape[0]), 8):  # one m16n8k8 k-step
            rows = slice(k0, min(k0 + 8, p.shape[0]))
            for a, b in ((p_hi, d_hi), (p_hi, d_lo), (p_lo, d_hi)):
                part = fp32_toward_zero(part.astype(np.float64) + a[rows].astype(np.float64).T @ b[rows].astype(np.float64))
        acc = (acc + part).astype(np.float32) if per_step else part
    return acc


def main():
    rng = np.random.default_rng(0)
    for queries, keys in ((1013, 65), (1013, 8), (8000, 65)):
        s = rng.standard_normal((queries, keys))
        p = np.exp(s - s.max(1, keepdims=True))
        p = (p / p.sum(1, keepdims=True)).astype(np.float32)
        d_out = rng.standard_normal((queries, 64)).astype(np.float32)
        ref = p.astype(np.float64).T @ d_out.astype(np.float64)
        naive = np.zeros((keys, 64), np.float32)
        for i in range(queries):
            naive = (naive + np.outer(p[i], d_out[i]).astype(np.float32)).astype(np.float32)
        err = lambda x: float(np.abs(x.astype(np.float64) - ref).max())
        print(f"{queries} rows x {keys} keys: naive fp32 {err(naive):.2e}, "
              f"tensor cores straight {err(tensor_core_sum(p, d_out, 16, False)):.2e}, "
              f"per step {err(tensor_core_sum(p, d_out, 16, True)):.2e}")


if __name__ == "__main__":
    main()
