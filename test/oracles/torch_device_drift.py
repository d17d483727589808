#!/usr/bin/python3
"""How far PyTorch's own CPU and GPU trajectories part: the outside yardstick of the engine's GPU
tests (test/gpu/gpu-training.test.js).

ResNet-18 and VGG-19bn (dropout off) at CIFAR size take 3 SGD steps (lr 0.05, momentum 0.9,
weight decay 1e-4) from the same weights on the same batches of 128 random images, on the CPU in
float32 (twice: with 1 thread and with all of them) and on the GPU with TF32 off. After each step it
prints, against the one-thread CPU run, the largest ‖a − b‖ / ‖b‖ over the parameter tensors and the
relative difference of the losses, as one JSON line per model and step.

    OMP_NUM_THREADS=16 python3 test/oracles/torch_device_drift.py [--steps 3] [--batch 128]
"""

import argparse
import copy
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402


def trajectory(model, batches, device, threads=None):
    """The parameters (on the host) and the loss after each step."""
    if threads is not None:
        torch.set_num_threads(threads)
    model = copy.deepcopy(model).to(device).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    out = []
    for images, labels in batches:
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(images.to(device)), labels.to(device))
        loss.backward()
        opt.step()
        out.append((loss.item(), {n: p.detach().cpu().clone() for n, p in model.named_parameters()}))
    return out


def worst(a, b):
    # A tensor that holds only rounding (a convolution bias before batch norm: its gradient is exactly
    # zero, and it starts at zero) has no relative error to speak of: below 1e-6 of the parameters'
    # norm it is left out, as in test/gpu/gpu-training.test.js.
    total = float(torch.sqrt(sum(t.double().norm() ** 2 for t in b.values())))
    return max(float((a[n] - b[n]).norm() / b[n].norm()) for n in b if float(b[n].norm()) >= 1e-6 * total)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--steps', type=int, default=3)
    parser.add_argument('--batch', type=int, default=128)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    batches = [(torch.randn(args.batch, 3, 32, 32), torch.randint(0, 10, (args.batch,))) for _ in range(args.steps)]
    threads = torch.get_num_threads()
    for name in ('resnet18', 'vgg19bn'):
        torch.manual_seed(1)
        model = models.without_dropout(models.build(name, 10))
        runs = {
            'cpu1': trajectory(model, batches, 'cpu', 1),
            f'cpu{threads}': trajectory(model, batches, 'cpu', threads),
        }
        if torch.cuda.is_available():
            runs['cuda'] = trajectory(model, batches, 'cuda')
        reference = runs['cpu1']
        for step in range(args.steps):
            row = {'model': name, 'step': step + 1}
            for key, run in runs.items():
                if key == 'cpu1':
                    continue
                row[f'{key} vs cpu1: worst tensor'] = worst(run[step][1], reference[step][1])
                row[f'{key} vs cpu1: loss'] = abs(run[step][0] - reference[step][0]) / abs(reference[step][0])
            print(json.dumps(row), flush=True)


if __name__ == '__main__':
    main()
