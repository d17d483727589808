#!/usr/bin/python3
"""Time one PyTorch training step, the peer baseline for the engine's bench.

A step is: zero_grad, forward, cross-entropy, backward, SGD update
(lr 0.05, momentum 0.9, nesterov, weight_decay 1e-4) on a fixed random
CIFAR-shaped batch. Prints one JSON line to stdout; diagnostics go to stderr.
On a GPU (--device cuda) TF32 is off for cuBLAS and cuDNN, cuDNN chooses its
algorithms by timing them (cudnn.benchmark), each step ends with a device
synchronisation, and the peak of allocated GPU memory is reported.

    OMP_NUM_THREADS=2 /usr/bin/python3 bench/peers/torch_step.py \
        --model resnet18 --batch 32 --threads 2 --warmup 3 --steps 10
"""

import argparse
import json
import os
import statistics
import sys
import time

# OpenMP reads OMP_NUM_THREADS when torch is loaded, so this must be checked
# before the import: set_num_threads alone would leave the OpenMP pool sized
# from the environment/default and make results depend on the caller's shell.
_OMP = os.environ.get('OMP_NUM_THREADS')
if not _OMP:
    sys.exit('torch_step.py: OMP_NUM_THREADS must be set (e.g. OMP_NUM_THREADS=2)')

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description='Time a PyTorch CIFAR training step.')
    p.add_argument('--model', choices=sorted(models.MODELS), default='resnet18')
    p.add_argument('--batch', type=int, default=32)
    p.add_argument('--threads', type=int, default=None,
                   help='torch.set_num_threads value (default: OMP_NUM_THREADS)')
    p.add_argument('--warmup', type=int, default=3)
    p.add_argument('--steps', type=int, default=10)
    p.add_argument('--classes', type=int, default=10)
    p.add_argument('--channels-last', action='store_true')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--device', choices=['cpu', 'cuda'], default='cpu')
    args = p.parse_args(argv)
    if args.threads is None:
        try:
            args.threads = int(_OMP)
        except ValueError:
            p.error(f'OMP_NUM_THREADS={_OMP!r} is not an integer; pass --threads')
    if args.threads < 1 or args.batch < 1 or args.steps < 1 or args.warmup < 0:
        p.error('--threads, --batch and --steps must be >= 1, --warmup >= 0')
    return args


def main(argv=None):
    args = parse_args(argv)
    if _OMP != str(args.threads):
        print(f'warning: OMP_NUM_THREADS={_OMP} but --threads={args.threads}; '
              'the OpenMP pool and torch may disagree', file=sys.stderr)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    gpu = args.device == 'cuda'
    if gpu:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.benchmark = True
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    model = models.build(args.model, args.classes).to(device=args.device, memory_format=fmt)
    model.train()
    # One fixed batch: the peer measures compute, not data loading, and a
    # constant input keeps step-to-step variance down to the machine's noise.
    x = torch.randn(args.batch, 3, 32, 32).contiguous(memory_format=fmt).to(args.device)
    y = torch.randint(0, args.classes, (args.batch,)).to(args.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9,
                          nesterov=True, weight_decay=1e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if gpu:
            torch.cuda.synchronize()
        return loss

    for _ in range(args.warmup):
        step()
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        loss = step()
        times.append((time.perf_counter() - t0) * 1e3)
    # A diverging run would mean the step is not doing what the engine does.
    if not torch.isfinite(loss):
        print(f'warning: non-finite loss {loss.item()}', file=sys.stderr)

    print(json.dumps({
        'peer': 'pytorch',
        'torch': torch.__version__,
        'model': args.model,
        'batch': args.batch,
        'classes': args.classes,
        'threads': args.threads,
        'channels_last': args.channels_last,
        'warmup': args.warmup,
        'steps': args.steps,
        'step_ms_median': round(statistics.median(times), 3),
        'step_ms_min': round(min(times), 3),
        'step_ms_all': [round(t, 3) for t in times],
        'mkldnn': torch.backends.mkldnn.is_available(),
        'device': torch.cuda.get_device_name() if gpu else 'cpu',
        'peak_memory_bytes': torch.cuda.max_memory_allocated() if gpu else None,
    }))
    return 0


if __name__ == '__main__':
    sys.exit(main())
