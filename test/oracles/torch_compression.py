"""PyTorch versions of the compression rounds timed by bench/compression.js.

Reads cases on stdin, one JSON object per line, and times each as soon as it arrives, answering with one
JSON line: {"name", "ms_median", "ms_all", "input_sum"} (input_sum: the float64 sum of the case's
gradients and initial Q's, for the caller to check). A case sent again (the caller's next round) reuses
its prepared tensors.
Each case is one of
  {"name", "kind": "powersgd", "shapes": [[...], ...], "rank": r, "q": [offset per tensor, -1: none]}
                                                                     error feedback + compress + decompress
  {"name", "kind": "topk", "shapes": [[...], ...], "ratio": K}        error feedback + select + scatter
  {"name", "kind": "gram_schmidt", "rows": n, "cols": r}
The input is the engine's: --gradients is the pool of float32 values bench/compression.js drew, and a
case's tensors are its consecutive slices from the start (Gram-Schmidt: the first rows·cols, row-major);
--q holds every PowerSGD matrix's initial Q as the engine draws it, (m, r) row-major, at the case's
offsets. Before every timed round (untimed) the state of the first round is restored: error memories
zero, Q the initial one; the gradients are never written. No communication: a single worker, as in
the engine's benchmark. Written the way PyTorch's PowerSGD hook and the reference TopK reducers
compute, with torch operations. On a GPU (--device cuda) PowerSGD runs as the hook does with
batch_tensors_with_same_shape: the matrices of one shape as one batch (stored batched here, so no
stacking is timed), bmm for both products, and the hook's orthogonalisation (batched Gram-Schmidt up
to rank 2, batched QR above); each round ends with torch.cuda.synchronize().

Run: OMP_NUM_THREADS=2 /usr/bin/python3 test/oracles/torch_compression.py --threads 2 --gradients G.f32 --q Q.f32 \
       [--device cuda] < cases.jsonl
"""
import argparse
import json
import math
import sys
import time

import numpy
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


def slices(pool, shapes):
    """The case's tensors: consecutive slices of the pool from its start, one per shape."""
    out, offset = [], 0
    for shape in shapes:
        n = math.prod(shape)
        out.append(pool[offset : offset + n].view(shape))
        offset += n
    if offset > pool.numel():
        raise ValueError(f"the gradient pool holds {pool.numel()} floats, the case needs {offset}")
    return out


def initial_q(qs, offset, m, r):
    if offset < 0:
        raise ValueError("a compressed matrix has no initial Q in the case")
    return qs[offset : offset + m * r].view(m, r)


def input_sum(case, pool, qs):
    """Σ of the case's gradients and initial Q's in float64: bench/compression.js checks it is its own."""
    if case["kind"] == "gram_schmidt":
        return float(pool[: case["rows"] * case["cols"]].double().sum())
    total = sum(float(g.double().sum()) for g in slices(pool, case["shapes"]))
    if case["kind"] == "powersgd":
        for shape, offset in zip(case["shapes"], case["q"]):
            if len(shape) > 1:
                m = math.prod(shape[1:])
                total += float(initial_q(qs, offset, m, min(shape[0], m, case["rank"])).double().sum())
    return total


def powersgd_reset(state, q0s):
    """The reset of PowerSGD's (gradient, memory, Q) entries: zero memories and every Q its first draw."""

    def reset():
        for (_, memory, q), q0 in zip(state, q0s):
            memory.zero_()
            q.copy_(q0)

    return reset


def prepare(case, pool, qs, device):
    """(reset, round): reset restores the first round's state (untimed), round is timed."""
    kind = case["kind"]
    if kind == "powersgd" and device.type == "cuda":
        by_shape = {}
        for i, (shape, g) in enumerate(zip(case["shapes"], slices(pool, case["shapes"]))):
            if len(shape) > 1:
                n = shape[0]
                m = g.numel() // n
                r = min(n, m, case["rank"])
                by_shape.setdefault((n, m, r), []).append((g.reshape(n, m), initial_q(qs, case["q"][i], m, r)))
        groups, q0s = [], []
        for entries in by_shape.values():
            g = torch.stack([e[0] for e in entries]).to(device)
            q0 = torch.stack([e[1] for e in entries]).to(device)
            groups.append((g, torch.zeros_like(g), q0.clone()))
            q0s.append(q0)
        return powersgd_reset(groups, q0s), lambda: powersgd_round_batched(groups)
    if kind == "powersgd":
        state, q0s = [], []
        for i, (shape, g) in enumerate(zip(case["shapes"], slices(pool, case["shapes"]))):
            if len(shape) < 2:
                continue
            n = shape[0]
            m = g.numel() // n
            r = min(n, m, case["rank"])
            q0 = initial_q(qs, case["q"][i], m, r)
            state.append((g, torch.zeros_like(g), q0.clone()))
            q0s.append(q0)
        return powersgd_reset(state, q0s), lambda: powersgd_round(state)
    if kind == "topk":
        state = []
        for g in slices(pool, case["shapes"]):
            count = max(1, int(math.floor(case["ratio"] * g.numel())))
            g = g.to(device)
            state.append((g, torch.zeros_like(g), count))

        def reset():
            for _, memory, _ in state:
                memory.zero_()

        return reset, lambda: topk_round(state)
    if kind == "gram_schmidt":
        base = pool[: case["rows"] * case["cols"]].view(case["rows"], case["cols"])
        work = base.clone()
        return (lambda: work.copy_(base)), (lambda: gram_schmidt(work))
    raise ValueError(f"unknown case kind {kind}")


def time_case(reset, fn, min_time, min_runs, sync):
    for _ in range(3):
        reset()
        fn()
    sync()
    samples = []
    spent = 0.0
    while len(samples) < min_runs or spent < min_time:
        reset()
        sync()
        t = time.perf_counter()
        fn()
        sync()
        samples.append((time.perf_counter() - t) * 1000)
        spent += samples[-1] / 1000
    samples.sort()
    return samples


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--min-time", type=float, default=0.3)
    parser.add_argument("--min-runs", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--gradients", required=True, help="float32 pool written by bench/compression.js")
    parser.add_argument("--q", required=True, help="float32 initial Q's written by bench/compression.js")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    pool = torch.from_numpy(numpy.fromfile(args.gradients, dtype="<f4"))
    qs = torch.from_numpy(numpy.fromfile(args.q, dtype="<f4"))
    prepared = {}
    with torch.no_grad():
        for line in sys.stdin:
            if not line.strip():
                continue
            case = json.loads(line)
            if case["name"] not in prepared:
                prepared[case["name"]] = prepare(case, pool, qs, device)
            reset, fn = prepared[case["name"]]
            samples = time_case(reset, fn, args.min_time, args.min_runs, sync)
            record = {"name": case["name"], "ms_median": samples[len(samples) // 2], "ms_all": samples, "input_sum": input_sum(case, pool, qs)}
            print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
