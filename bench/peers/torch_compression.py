"""PyTorch versions of the compression rounds timed by bench/compression.js.

Reads a JSON list of cases on stdin and prints one JSON object per line: {"name", "ms_median", "ms_all"}.
Each case is one of
  {"name", "kind": "powersgd", "shapes": [[...], ...], "rank": r}   error feedback + compress + decompress
  {"name", "kind": "topk", "shapes": [[...], ...], "ratio": K}        error feedback + select + scatter
  {"name", "kind": "gram_schmidt", "rows": n, "cols": r}
No communication: a single worker, as in the engine's benchmark. Written the way PyTorch's
PowerSGD hook and the reference TopK reducers compute, with torch operations. On a GPU
(--device cuda) PowerSGD runs as the hook does with batch_tensors_with_same_shape: the matrices of
one shape as one batch (stored batched here, so no stacking is timed), bmm for both products, and
the hook's orthogonalisation (batched Gram-Schmidt up to rank 2, batched QR above); each round ends
with torch.cuda.synchronize().

Run: OMP_NUM_THREADS=2 /usr/bin/python3 bench/peers/torch_compression.py --threads 2 [--device cuda] < cases.json
"""
import argparse
import json
import math
import sys
import time

import torch


def gram_schmidt(p, eps=1e-8):
    # Column by column, as torch.distributed's PowerSGD hook does for small ranks.
    cols = p.shape[1]
    for i in range(cols):
        col = p[:, i : i + 1]
        col.div_(torch.norm(col) + eps)
        if i + 1 < cols:
            rest = p[:, i + 1 :]
            rest.sub_(torch.sum(col * rest, dim=0) * col)


def powersgd_round(state):
    out = []
    for g, memory, q in state:
        m = (g + memory).view(g.shape[0], -1)
        p = m @ q
        gram_schmidt(p)
        q.copy_(m.t() @ p)
        approx = p @ q.t()
        memory.copy_((m - approx).view_as(memory))
        out.append(approx)
    return out


def orthogonalize_batched(p, eps=1e-8):
    # PyTorch's PowerSGD hook (_orthogonalize): Gram-Schmidt over a batch up to rank 2, QR above.
    rank = p.shape[2]
    if rank <= 2:
        for i in range(rank):
            col = p[:, :, i : i + 1]
            col.div_(torch.norm(col, dim=1, keepdim=True) + eps)
            if i + 1 < rank:
                rest = p[:, :, i + 1 :]
                rest.sub_(torch.sum(col * rest, dim=1, keepdim=True) * col)
    else:
        torch.linalg.qr(p, out=(p, torch.empty(p.shape[0], rank, rank, device=p.device, dtype=p.dtype)))


def powersgd_round_batched(groups):
    out = []
    for g, memory, q in groups:  # (B, n, m), (B, n, m), (B, m, r)
        m = g + memory
        p = torch.bmm(m, q)
        orthogonalize_batched(p)
        torch.bmm(m.transpose(1, 2), p, out=q)
        approx = torch.bmm(p, q.transpose(1, 2))
        torch.sub(m, approx, out=memory)
        out.append(approx)
    return out


def topk_round(state):
    out = []
    for g, memory, count in state:
        a = (g + memory).view(-1)
        _, idx = torch.topk(a.abs(), count, sorted=False)
        sparse = torch.zeros_like(a)
        sparse[idx] = a[idx]
        a[idx] = 0
        memory.copy_(a.view_as(memory))
        out.append(sparse)
    return out


def prepare(case, gen, device):
    kind = case["kind"]
    if kind == "powersgd" and device.type == "cuda":
        by_shape = {}
        for shape in case["shapes"]:
            if len(shape) > 1:
                by_shape.setdefault((shape[0], math.prod(shape[1:])), []).append(shape)
        groups = []
        for (n, m), shapes in by_shape.items():
            r = min(n, m, case["rank"])
            g = torch.randn(len(shapes), n, m, generator=gen).to(device)
            groups.append((g, torch.zeros_like(g), torch.randn(len(shapes), m, r, generator=gen).to(device)))
        return lambda: powersgd_round_batched(groups)
    if kind == "powersgd":
        state = []
        for shape in case["shapes"]:
            if len(shape) < 2:
                continue
            g = torch.randn(shape, generator=gen)
            n = shape[0]
            m = g.numel() // n
            r = min(n, m, case["rank"])
            state.append((g, torch.zeros_like(g), torch.randn(m, r, generator=gen)))
        return lambda: powersgd_round(state)
    if kind == "topk":
        state = []
        for shape in case["shapes"]:
            g = torch.randn(shape, generator=gen)
            count = max(1, int(math.floor(case["ratio"] * g.numel())))
            state.append((g.to(device), torch.zeros_like(g, device=device), count))
        return lambda: topk_round(state)
    if kind == "gram_schmidt":
        base = torch.randn(case["rows"], case["cols"], generator=gen)
        work = base.clone()

        def run():
            work.copy_(base)
            gram_schmidt(work)

        return run
    raise ValueError(f"unknown case kind {kind}")


def time_case(fn, min_time, min_runs, sync):
    for _ in range(3):
        fn()
    sync()
    samples = []
    start = time.perf_counter()
    while len(samples) < min_runs or time.perf_counter() - start < min_time:
        t = time.perf_counter()
        fn()
        sync()
        samples.append((time.perf_counter() - t) * 1000)
    samples.sort()
    return samples


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--min-time", type=float, default=0.3)
    parser.add_argument("--min-runs", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for case in json.load(sys.stdin):
            samples = time_case(prepare(case, gen, device), args.min_time, args.min_runs, sync)
            print(json.dumps({"name": case["name"], "ms_median": samples[len(samples) // 2], "ms_all": samples}), flush=True)


if __name__ == "__main__":
    main()
