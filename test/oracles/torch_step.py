#!/usr/bin/python3
"""Time one PyTorch training step, the peer baseline for the engine's bench.

A step is: zero_grad, forward, cross-entropy, backward, SGD update
(lr 0.05, momentum 0.9, nesterov, weight_decay 1e-4) on a fixed random
CIFAR-shaped batch. Prints one JSON line to stdout; diagnostics go to stderr.
On a GPU (--device cuda) TF32 is off for cuBLAS and cuDNN unless --tf32, cuDNN
chooses its algorithms by timing them (cudnn.benchmark; --benchmark-limit 0
times every candidate instead of PyTorch's first 10), each step ends with a
device synchronisation, and the peak of allocated GPU memory after the warm-up
is reported. --kernels profiles one more step and reports its GPU kernels by
time (which convolution algorithms cuDNN chose); --compile runs the model
through torch.compile.

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
    p.add_argument('--autocast', action='store_true', help='forward and loss under torch.autocast(device, dtype=torch.bfloat16), as users train in bf16')
    p.add_argument('--tf32', action='store_true', help='on a GPU, let cuBLAS and cuDNN use TF32 (PyTorch\'s default for convolutions)')
    p.add_argument('--benchmark-limit', type=int, default=None, help='on a GPU, how many cuDNN candidates cudnn.benchmark times (0: all; default PyTorch\'s 10)')
    p.add_argument('--compile', action='store_true', help='the model through torch.compile (its compilation falls in the warm-up)')
    p.add_argument('--kernels', type=int, default=0, metavar='N', help='on a GPU, profile one more step and report its N costliest kernels')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--device', choices=['cpu', 'cuda'], default='cpu')
    args = p.parse_args(argv)
    timing.resolve_threads(p, args, _OMP)
    if args.threads < 1 or args.batch < 1 or args.steps < 1 or args.warmup < 0:
        p.error('--threads, --batch and --steps must be >= 1, --warmup >= 0')
    if args.device != 'cuda' and (args.tf32 or args.benchmark_limit is not None or args.kernels):
        p.error('--tf32, --benchmark-limit and --kernels need --device cuda')
    if args.benchmark_limit is not None and args.benchmark_limit < 0:
        p.error('--benchmark-limit must be >= 0')
    return args


def kernel_table(step, count):
    """The `count` GPU kernels of one profiled step that took longest: name, calls, microseconds."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step(0)
    rows = [e for e in prof.key_averages() if e.device_type.name == 'CUDA' and e.self_device_time_total > 0]
    rows.sort(key=lambda e: -e.self_device_time_total)
    return [{'name': e.key[:160], 'calls': e.count, 'us': round(e.self_device_time_total, 1)} for e in rows[:count]]


def main(argv=None):
    args = parse_args(argv)
    timing.set_threads(args.threads, _OMP, args.seed)

    gpu = timing.on_gpu(args.device, benchmark=True, tf32=args.tf32)
    if gpu and args.benchmark_limit is not None:
        torch.backends.cudnn.benchmark_limit = args.benchmark_limit
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    model = models.build(args.model, args.classes).to(device=args.device, memory_format=fmt)
    model.train()
    forward = torch.compile(model) if args.compile else model
    # One fixed batch: the peer measures compute, not data loading, and a
    # constant input keeps step-to-step variance down to the machine's noise.
    x = torch.randn(args.batch, 3, 32, 32).contiguous(memory_format=fmt).to(args.device)
    y = torch.randint(0, args.classes, (args.batch,)).to(args.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9,
                          nesterov=True, weight_decay=1e-4)

    def step(_):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.autocast):
            loss = F.cross_entropy(forward(x), y)
        loss.backward()
        opt.step()
        if gpu:
            torch.cuda.synchronize()
        return loss

    seconds, loss = timing.time_steps(step, args.warmup, args.steps, gpu=gpu)
    timing.warn_if_diverged(loss)
    peak = torch.cuda.max_memory_allocated() if gpu else None
    kernels = None
    if args.kernels:
        try:
            kernels = kernel_table(step, args.kernels)
        except Exception as e:  # the profile is a diagnosis: its failure leaves the timing standing
            kernels = [{'error': repr(e)[:300]}]

    print(json.dumps({
        'peer': 'pytorch',
        'torch': torch.__version__,
        'model': args.model,
        'batch': args.batch,
        'classes': args.classes,
        'threads': args.threads,
        'channels_last': args.channels_last,
        'autocast': args.autocast,
        'tf32': args.tf32,
        'benchmark_limit': torch.backends.cudnn.benchmark_limit if gpu else None,
        'compile': args.compile,
        'warmup': args.warmup,
        'steps': args.steps,
        **timing.step_figures(seconds),
        'mkldnn': torch.backends.mkldnn.is_available(),
        'device': torch.cuda.get_device_name() if gpu else 'cpu',
        'peak_memory_bytes': peak,
        **({'kernels': kernels} if kernels is not None else {}),
    }))
    return 0


if __name__ == '__main__':
    sys.exit(main())
