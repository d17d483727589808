#!/usr/bin/python3
"""The activations PyTorch's autograd keeps for backward after one training
forward pass (and the loss), the yardstick of the engine's own count on the CPU
(BENCHMARKS.md, GPU, memory): every tensor autograd saves, counted once per
storage, less the parameters and the input batch; with --autocast under
torch.autocast('cpu', dtype=torch.bfloat16), as users train in bf16. Prints one
JSON line per model with the bytes.

    OMP_NUM_THREADS=2 /usr/bin/python3 test/oracles/torch_saved.py --batch 128
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import timing  # noqa: E402

_OMP = timing.require_omp('torch_saved.py', 2)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import models  # noqa: E402


def saved_bytes(model, x, labels, autocast):
    """Bytes of the storages autograd saves in model(x) and its loss, the parameters' and x's left out."""
    storages = {}

    def pack(t):
        storage = t.untyped_storage() if hasattr(t, 'untyped_storage') else t.storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast('cpu', dtype=torch.bfloat16, enabled=autocast):
        F.cross_entropy(model(x), labels)
    outside = {p.data_ptr() for p in model.parameters()} | {x.data_ptr()}
    return sum(n for ptr, n in storages.items() if ptr not in outside)


def main(argv=None):
    p = argparse.ArgumentParser(description="Bytes of activations PyTorch's autograd saves in one training forward pass.")
    p.add_argument('--models', default='resnet18,vgg19bn')
    p.add_argument('--batch', type=int, default=128)
    p.add_argument('--width', type=float, default=1.0)
    p.add_argument('--autocast', action='store_true', help="under torch.autocast('cpu', dtype=torch.bfloat16)")
    timing.add_threads_arg(p)
    args = p.parse_args(argv)
    timing.resolve_threads(p, args, _OMP)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    for name in args.models.split(','):
        if name not in models.MODELS:
            p.error(f'unknown model {name!r} (known: {", ".join(sorted(models.MODELS))})')
        model = models.build(name, 10, args.width).train()
        x = torch.randn(args.batch, 3, 32, 32)
        labels = torch.randint(0, 10, (args.batch,))
        saved = saved_bytes(model, x, labels, args.autocast)
        print(json.dumps({'model': name, 'batch': args.batch, 'width': args.width, 'autocast': args.autocast, 'saved_activation_bytes': saved,
                          'saved_activation_mib': round(saved / 2**20, 1)}))


if __name__ == '__main__':
    main()
