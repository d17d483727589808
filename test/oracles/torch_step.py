#!/usr/bin/python3
"""Time one PyTorch training step, the peer baseline for the engine's bench.

A step is: zero_grad, forward, cross-entropy, backward, SGD update
(lr 0.05, momentum 0.9, nesterov, weight_decay 1e-4) on a fixed random
CIFAR-shaped batch. Prints one JSON line to stdout; diagnostics go to stderr.
On a GPU (--device cuda) TF32 is off for cuBLAS and cuDNN, cuDNN chooses its
algorithms by timing them (cudnn.benchmark), each step ends with a device
synchronisation, and the peak of allocated GPU memory is reported.

    OMP_NUM_THREADS=2 /usr/bin/python3 test/oracles/torch_step.py \
        --model resnet18 --batch 32 --threads 2 --warmup 3 --steps 10
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import timing  # noqa: E402

# Checked before torch loads (see timing.require_omp).
_OMP = timing.require_omp('torch_step.py', 2)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import models  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description='Time a PyTorch CIFAR training step.')
    p.add_argument('--model', choices=sorted(models.MODELS), default='resnet18')
    p.add_argument('--batch', type=int, default=32)
    timing.add_threads_arg(p)
    p.add_argument('--warmup', type=int, default=3)
    p.add_argument('--steps', type=int, default=10)
    p.add_argument('--classes', type=int, default=10)
    p.add_argument('--channels-last', action='store_true')
    p.add_argument('--autocast', action='store_true', help="forward and loss under torch.autocast('cpu', dtype=torch.bfloat16), as users train in bf16")
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--device', choices=['cpu', 'cuda'], default='cpu')
    args = p.parse_args(argv)
    timing.resolve_threads(p, args, _OMP)
    if args.threads < 1 or args.batch < 1 or args.steps < 1 or args.warmup < 0:
        p.error('--threads, --batch and --steps must be >= 1, --warmup >= 0')
    return args


def main(argv=None):
    args = parse_args(argv)
    timing.set_threads(args.threads, _OMP, args.seed)

    gpu = timing.on_gpu(args.device, benchmark=True)
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    model = models.build(args.model, args.classes).to(device=args.device, memory_format=fmt)
    model.train()
    # One fixed batch: the peer measures compute, not data loading, and a
    # constant input keeps step-to-step variance down to the machine's noise.
    x = torch.randn(args.batch, 3, 32, 32).contiguous(memory_format=fmt).to(args.device)
    y = torch.randint(0, args.classes, (args.batch,)).to(args.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9,
                          nesterov=True, weight_decay=1e-4)

    def step(_):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.autocast):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if gpu:
            torch.cuda.synchronize()
        return loss

    seconds, loss = timing.time_steps(step, args.warmup, args.steps, gpu=gpu)
    timing.warn_if_diverged(loss)

    print(json.dumps({
        'peer': 'pytorch',
        'torch': torch.__version__,
        'model': args.model,
        'batch': args.batch,
        'classes': args.classes,
        'threads': args.threads,
        'channels_last': args.channels_last,
        'autocast': args.autocast,
        'warmup': args.warmup,
        'steps': args.steps,
        **timing.step_figures(seconds),
        'mkldnn': torch.backends.mkldnn.is_available(),
        'device': torch.cuda.get_device_name() if gpu else 'cpu',
        'peak_memory_bytes': torch.cuda.max_memory_allocated() if gpu else None,
    }))
    return 0


if __name__ == '__main__':
    sys.exit(main())
