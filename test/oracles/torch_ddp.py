#!/usr/bin/python3
"""One worker of PyTorch DDP training ResNet-18 on the CPU over Gloo: the peer of
the engine's overlapped exchange (bench/overlap.js runs one per simulated host).

DDP buckets the gradients (bucket_cap_mb) and all-reduces each bucket while
backward runs, optionally through PyTorch's PowerSGD or fp16 communication hook. A step
is zero_grad, forward, cross-entropy, backward (with the overlapped all-reduces)
and the SGD update (lr 0.1, momentum 0.9, nesterov, weight_decay 1e-4) on a
fixed random CIFAR-shaped batch. Rank 0's batch-norm buffers are broadcast before
every forward (DDP's default, as the engine does). Rank 0 prints one JSON line.

    OMP_NUM_THREADS=1 /usr/bin/python3 test/oracles/torch_ddp.py --rank 0 \
        --world 2 --master 10.87.0.1:29511 --bucket-mb 25 --hook none
"""

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import timing  # noqa: E402

timing.require_omp('torch_ddp.py', 1)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

import models  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description='Time PyTorch DDP steps of ResNet-18 on the CPU over Gloo.')
    timing.add_group_args(p)
    p.add_argument('--bucket-mb', type=float, default=25.0)
    p.add_argument('--hook', choices=['none', 'powersgd', 'fp16'], default='none')
    p.add_argument('--powersgd-rank', type=int, default=2)
    p.add_argument('--batch', type=int, default=64, help='per worker')
    p.add_argument('--warmup', type=int, default=3)
    p.add_argument('--steps', type=int, default=8)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(0)
    timing.join_group(args)
    model = DistributedDataParallel(models.resnet18(10), bucket_cap_mb=args.bucket_mb, broadcast_buffers=True)
    if args.hook == 'powersgd':
        # Error feedback and warm start as the engine's PowerSGD; every matrix compressed (rate 0).
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=args.powersgd_rank,
                                            start_powerSGD_iter=2, min_compression_rate=0,
                                            use_error_feedback=True, warm_start=True)
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    elif args.hook == 'fp16':
        # Each bucket cast to fp16, divided by the world size, all-reduced in fp16, cast back.
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4)
    generator = torch.Generator().manual_seed(args.rank)
    images = torch.randn(args.batch, 3, 32, 32, generator=generator)
    labels = torch.randint(0, 10, (args.batch,), generator=generator)

    def step(_):
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(images), labels).backward()
        optimizer.step()

    # Every worker starts each step together (the barrier, untimed), as the engine's steps do.
    seconds, _ = timing.time_steps(step, args.warmup, args.steps, before=dist.barrier)
    if args.rank == 0:
        print(json.dumps({
            'peer': 'pytorch-ddp', 'torch': torch.__version__, 'hook': args.hook, 'bucketMb': args.bucket_mb,
            'batch': args.batch, 'world': args.world, 'threads': torch.get_num_threads(),
            'stepSeconds': statistics.median(seconds), 'steps': len(seconds),
        }))
    dist.destroy_process_group()


if __name__ == '__main__':
    main()
