#!/usr/bin/python3
"""One worker of PyTorch DDP taking given training steps: the outside reference of the
engine's data-parallel semantics (test/comm/ddp.test.js).

Every rank starts from the same state_dict (--state) and trains --steps steps on
its own batches (--batches holds `step{s}.rank{r}.images`, float32 NCHW already
normalised, and `step{s}.rank{r}.labels`, int32) through
DistributedDataParallel over Gloo with broadcast_buffers on (PyTorch's default:
rank 0's buffers are broadcast before every forward), cross-entropy and SGD
(momentum, Nesterov, weight decay as the engine's defaults). After each step the
rank's whole state_dict (parameters and buffers) is written as `step{s}.{name}`
into --out (one safetensors file per rank), with `step{s}.loss` and
`step{s}.margin`: how close any ReLU decision of the step's forward came to a tie
(see torch_gradients.py); with --final-state only the state after the last step
is written, under the state_dict's own names (a model file), beside the losses and
margins. --momentum starts SGD from the momentum buffers of an engine's trainer
checkpoint (`optimizer.momentum_buffer.{name}`), so that a run can be taken up
mid-training. With --dtype float64 the whole job computes in float64: the
reference a float32 engine is held to at well-conditioned states.

    OMP_NUM_THREADS=1 /usr/bin/python3 test/oracles/torch_ddp_steps.py --rank 0 --world 2 \
        --master 127.0.0.1:29512 --model resnet18 --state init.safetensors \
        --batches batches.safetensors --steps 3 --lr 0.05 --out ddp-rank0.safetensors
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import timing  # noqa: E402

timing.require_omp('torch_ddp_steps.py', 1)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

import models  # noqa: E402
import safetensors_io  # noqa: E402
from torch_gradients import Margins  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description='Train given steps under PyTorch DDP (Gloo) and save the state after each.')
    timing.add_group_args(p)
    p.add_argument('--model', choices=sorted(models.MODELS), default='resnet18')
    p.add_argument('--classes', type=int, default=10)
    p.add_argument('--width', type=float, default=1.0, help="every convolution's channels x this factor (the engine's --width)")
    p.add_argument('--state', required=True, help='safetensors state_dict every rank starts from')
    p.add_argument('--batches', required=True, help='safetensors of step{s}.rank{r}.images / .labels')
    p.add_argument('--steps', type=int, required=True)
    p.add_argument('--lr', type=float, default=0.05)
    p.add_argument('--momentum', type=float, default=0.9)
    p.add_argument('--weight-decay', type=float, default=1e-4)
    p.add_argument('--momentum-state', help="safetensors holding optimizer.momentum_buffer.{name} for every parameter (an engine's trainer.safetensors)")
    p.add_argument('--final-state', action='store_true', help='write only the state after the last step, under its own names')
    p.add_argument('--dtype', choices=['float32', 'float64'], default='float32')
    p.add_argument('--out', required=True, help='safetensors file of this rank\'s state after each step')
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    timing.join_group(args)
    dtype = getattr(torch, args.dtype)
    model = models.build(args.model, args.classes, args.width).to(dtype)
    model.load_state_dict(safetensors_io.load_state_dict(args.state))
    models.without_dropout(model)
    ddp = DistributedDataParallel(model, broadcast_buffers=True)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, nesterov=True,
                          weight_decay=args.weight_decay)
    if args.momentum_state:
        saved = safetensors_io.load_state_dict(args.momentum_state)
        for name, param in model.named_parameters():
            key = f'optimizer.momentum_buffer.{name}'
            if key not in saved:
                sys.exit(f'torch_ddp_steps.py: {args.momentum_state} holds no {key}')
            opt.state[param]['momentum_buffer'] = saved[key].to(dtype).reshape(param.shape).clone()
    batches = safetensors_io.load_state_dict(args.batches)
    out = {}
    for s in range(args.steps):
        images = batches[f'step{s}.rank{args.rank}.images'].to(dtype)
        labels = batches[f'step{s}.rank{args.rank}.labels'].long()
        model.train()
        margins = Margins(model)
        loss = F.cross_entropy(ddp(images), labels)
        margins.close()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if not args.final_state or s == args.steps - 1:
            prefix = '' if args.final_state else f'step{s}.'
            for name, t in model.state_dict().items():
                out[prefix + name] = t.detach().clone()
        out[f'step{s}.loss'] = torch.tensor([loss.item()], dtype=torch.float64)
        out[f'step{s}.margin'] = torch.tensor([margins.smallest], dtype=torch.float64)
    safetensors_io.save_state_dict(out, args.out)
    dist.destroy_process_group()


if __name__ == '__main__':
    main()
