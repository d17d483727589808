#!/usr/bin/python3
"""Batch norm's running statistics replayed in float64: the outside oracle of the
running statistics a worker of the engine keeps (test/comm/ddp.test.js).

The input (safetensors) holds `initial.<buffer>` (the running statistics before
the first step) and, for every step s, the weights the worker had before it,
`step{s}.<parameter>`, and its batches, `step{s}.batch{b}.images` (float32 NCHW,
normalised; several for a step of micro-batches). Each batch is run forward in
training mode, in float64, through that step's weights, and every batch norm moves
its running statistics toward the batch's (momentum 0.1, unbiased variance), as
torch.nn.BatchNorm2d does; the statistics carry over from step to step. The
output holds the running statistics after the last step.

    OMP_NUM_THREADS=1 /usr/bin/python3 test/oracles/torch_running_stats.py --model resnet18 \
        --classes 10 --steps 3 replay.safetensors out.safetensors
"""

import argparse
import os
import sys

if not os.environ.get('OMP_NUM_THREADS'):
    sys.exit('torch_running_stats.py: OMP_NUM_THREADS must be set (e.g. OMP_NUM_THREADS=1)')

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402
import safetensors_io  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description='Replay batch norm running statistics in float64.')
    p.add_argument('--model', choices=sorted(models.MODELS), required=True)
    p.add_argument('--classes', type=int, default=10)
    p.add_argument('--steps', type=int, required=True)
    p.add_argument('input')
    p.add_argument('output')
    args = p.parse_args(argv)
    torch.set_num_threads(int(os.environ['OMP_NUM_THREADS']))
    data = safetensors_io.load_state_dict(args.input)
    model = models.without_dropout(models.build(args.model, args.classes).double())
    buffers = {k[len('initial.'):]: v.double() for k, v in data.items() if k.startswith('initial.')}
    parameters = {name for name, _ in model.named_parameters()}
    model.train()
    for s in range(args.steps):
        weights = {name: data[f'step{s}.{name}'].double() for name in parameters}
        model.load_state_dict({**weights, **buffers}, strict=False)
        b = 0
        with torch.no_grad():
            while f'step{s}.batch{b}.images' in data:
                model(data[f'step{s}.batch{b}.images'].double())
                b += 1
        if b == 0:
            sys.exit(f'torch_running_stats.py: step {s} has no batch')
        state = model.state_dict()
        buffers = {k: state[k].clone() for k in buffers}
    safetensors_io.save_state_dict(buffers, args.output)


if __name__ == '__main__':
    main()
