#!/usr/bin/python3
"""PyTorch's gradients of one training step, in float64 and float32: the outside
oracle of the engine's backward (test/native/gradients.test.js).

Each input file (safetensors) holds a model's state_dict (the engine's names,
which are PyTorch's) and one batch: `input.images` (float32 NCHW, normalised) and
`input.labels` (int32) for the CNNs, or `input.tokens` and `input.targets`
(int32, time-major (T, B)) with the carried `input.h` and `input.c` (float32
(layers, B, hidden)) for the LSTM. For each file the model is built in training
mode with dropout off, the mean cross-entropy of the batch is backpropagated in
float64 and again in float32, and the output file gets `f64.<name>` and
`f32.<name>` for every parameter's gradient, `loss` (float64), with --autocast also
`bf16.<name>` and `loss.bf16`: the float32 model's under torch.autocast('cpu', dtype=torch.bfloat16),
as its users train in mixed precision, and for the CNNs
`margin`: the smallest distance of any ReLU input from zero and of any max-pool
window's largest value from its runner-up (ties excluded), over the float64
forward. Where the margin exceeds the rounding of a float32 forward, float32
arithmetic takes every ReLU and max-pool decision that float64 takes, so its
gradient can agree with float64 to float32 precision.

    OMP_NUM_THREADS=1 /usr/bin/python3 test/oracles/torch_gradients.py --model resnet18 \
        --classes 10 in0.safetensors:out0.safetensors [in1:out1 ...]
    ... --model lstm --vocabulary 50 --hidden 16 --layers 2 in:out
"""

import argparse
import os
import sys

if not os.environ.get('OMP_NUM_THREADS'):
    sys.exit('torch_gradients.py: OMP_NUM_THREADS must be set (e.g. OMP_NUM_THREADS=1)')

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402
import safetensors_io  # noqa: E402


class LanguageModel(nn.Module):
    """PyTorch's word_language_model RNNModel (LSTM, decoder tied to the embedding), dropout off."""

    def __init__(self, vocabulary, hidden, layers):
        super().__init__()
        self.encoder = nn.Embedding(vocabulary, hidden)
        self.rnn = nn.LSTM(hidden, hidden, layers)
        self.decoder = nn.Linear(hidden, vocabulary)
        self.decoder.weight = self.encoder.weight

    def forward(self, tokens, state):
        out, _ = self.rnn(self.encoder(tokens), state)
        return self.decoder(out).view(-1, self.decoder.out_features)


class Margins:
    """Records, during a forward, how close any ReLU or max-pool decision came to a tie."""

    def __init__(self, model):
        self.smallest = float('inf')
        self.hooks = []
        for m in model.modules():
            if isinstance(m, nn.MaxPool2d):
                self.hooks.append(m.register_forward_pre_hook(lambda m, i: self.pool(i[0])))
            if isinstance(m, nn.ReLU):
                self.hooks.append(m.register_forward_pre_hook(lambda m, i: self.relu(i[0])))
        self.functional = F.relu
        F.relu = lambda x, *a, **k: (self.relu(x), self.functional(x, *a, **k))[1]

    def relu(self, x):
        self.smallest = min(self.smallest, x.detach().abs().min().item())

    def pool(self, x):
        # 2×2 windows with stride 2: the gap between each window's largest value and its runner-up.
        # Exact ties (equal inputs) pick the same element in any precision and are left out.
        n, c, h, w = x.shape
        windows = x.detach().reshape(n, c, h // 2, 2, w // 2, 2).permute(0, 1, 2, 4, 3, 5).reshape(-1, 4)
        top = windows.topk(2, dim=1).values
        gaps = top[:, 0] - top[:, 1]
        gaps = gaps[gaps > 0]
        if gaps.numel():
            self.smallest = min(self.smallest, gaps.min().item())

    def close(self):
        F.relu = self.functional
        for h in self.hooks:
            h.remove()


def build(args, dtype):
    if args.model == 'lstm':
        return LanguageModel(args.vocabulary, args.hidden, args.layers).to(dtype)
    return models.without_dropout(models.build(args.model, args.classes, args.width).to(dtype))


def gradients(args, inputs, dtype, margins=False, autocast=False):
    model = build(args, dtype)
    state = {k: v for k, v in inputs.items() if not k.startswith('input.')}
    if args.model == 'lstm':
        state.setdefault('decoder.weight', state['encoder.weight'])
    model.load_state_dict({k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}, strict=True)
    model.train()
    recorder = Margins(model) if margins else None
    with torch.autocast('cpu', dtype=torch.bfloat16, enabled=autocast):
        if args.model == 'lstm':
            carried = (inputs['input.h'].to(dtype), inputs['input.c'].to(dtype))
            logits = model(inputs['input.tokens'].long(), carried)
            loss = F.cross_entropy(logits, inputs['input.targets'].long().flatten())
        else:
            loss = F.cross_entropy(model(inputs['input.images'].to(dtype)), inputs['input.labels'].long())
    loss.backward()
    if recorder:
        recorder.close()
    grads = {name: p.grad.detach().to(torch.float64) for name, p in model.named_parameters()}
    return grads, loss.item(), recorder.smallest if recorder else None


def main(argv=None):
    p = argparse.ArgumentParser(description='Float64 and float32 gradients of one step of the engine\'s models.')
    p.add_argument('--model', choices=['resnet18', 'vgg19bn', 'lstm'], required=True)
    p.add_argument('--classes', type=int, default=10)
    p.add_argument('--vocabulary', type=int, default=0)
    p.add_argument('--hidden', type=int, default=0)
    p.add_argument('--layers', type=int, default=2)
    p.add_argument('--width', type=float, default=1.0)
    p.add_argument('--autocast', action='store_true', help='also the gradients under CPU autocast to bfloat16')
    p.add_argument('pairs', nargs='+', help='input.safetensors:output.safetensors')
    args = p.parse_args(argv)
    torch.set_num_threads(int(os.environ['OMP_NUM_THREADS']))
    for pair in args.pairs:
        source, target = pair.split(':')
        inputs = safetensors_io.load_state_dict(source)
        f64, loss, margin = gradients(args, inputs, torch.float64, margins=args.model != 'lstm')
        f32, _, _ = gradients(args, inputs, torch.float32)
        # Conditioning: every weight and input moved by a relative 1e-6 (seeded), the float64
        # gradient again; `moved` is the largest relative change over the tensors that are not zero.
        generator = torch.Generator().manual_seed(1)
        perturbed = {k: v * (1 + 1e-6 * (2 * torch.rand(v.shape, generator=generator, dtype=torch.float64) - 1)).to(v.dtype)
                     if v.is_floating_point() and 'running_' not in k else v for k, v in inputs.items()}
        moved_grads, _, _ = gradients(args, perturbed, torch.float64)
        total = torch.sqrt(sum((g ** 2).sum() for g in f64.values()))
        moved = max((torch.linalg.norm(moved_grads[k] - g) / torch.linalg.norm(g)).item()
                    for k, g in f64.items() if torch.linalg.norm(g) > 1e-12 * total)
        out = {f'f64.{k}': v for k, v in f64.items()}
        out.update({f'f32.{k}': v for k, v in f32.items()})
        out['loss'] = torch.tensor([loss], dtype=torch.float64)
        out['moved'] = torch.tensor([moved], dtype=torch.float64)
        if margin is not None:
            out['margin'] = torch.tensor([margin], dtype=torch.float64)
        if args.autocast:
            bf16, loss_bf16, _ = gradients(args, inputs, torch.float32, autocast=True)
            out.update({f'bf16.{k}': v for k, v in bf16.items()})
            out['loss.bf16'] = torch.tensor([loss_bf16], dtype=torch.float64)
        safetensors_io.save_state_dict(out, target)


if __name__ == '__main__':
    main()
