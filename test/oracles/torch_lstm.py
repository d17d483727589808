#!/usr/bin/python3
"""Time one PyTorch training step of the word-level LSTM language model, the
peer baseline for the engine's `lstm` bench suite.

The model is PyTorch's examples/word_language_model RNNModel with tied
weights: Embedding(V, H), Dropout, LSTM(H, H, layers, dropout), Dropout,
Linear(H, V) sharing the embedding's weight. A step is: detach the carried
hidden state, zero_grad, forward over a (bptt, batch) window, cross-entropy
over the vocabulary, backward, clip_grad_norm_ to `--clip`, SGD (lr 2.5,
momentum 0.9, Nesterov, weight decay 0). After the timed steps the same
number of forward-only windows (eval mode, no_grad, loss included) are timed
too, so the suite can split a step into forward and the rest for both peers.
On a GPU (--device cuda) nn.LSTM runs on cuDNN, TF32 is off for cuBLAS and
cuDNN, each timed step and window ends with a device synchronisation, and the
peak of allocated GPU memory is reported.
Prints one JSON line to stdout; diagnostics go to stderr.

    OMP_NUM_THREADS=2 /usr/bin/python3 test/oracles/torch_lstm.py \
        --vocab 33278 --hidden 650 --layers 2 --bptt 35 --batch 20 \
        --threads 2 --warmup 2 --steps 5
"""

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import timing  # noqa: E402

# Checked before torch loads (see timing.require_omp).
_OMP = timing.require_omp('torch_lstm.py', 2)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402


class RNNModel(nn.Module):
    """word_language_model's RNNModel, LSTM flavour, tied weights."""

    def __init__(self, vocab, hidden, layers, dropout):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(vocab, hidden)
        self.rnn = nn.LSTM(hidden, hidden, layers, dropout=dropout)
        self.decoder = nn.Linear(hidden, vocab)
        self.decoder.weight = self.encoder.weight
        self.vocab, self.hidden, self.layers = vocab, hidden, layers
        # The example's init: U(-0.1, 0.1) for the (shared) weight, zero decoder bias.
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)

    def forward(self, tokens, hidden):
        emb = self.drop(self.encoder(tokens))
        out, hidden = self.rnn(emb, hidden)
        out = self.drop(out)
        return self.decoder(out).view(-1, self.vocab), hidden

    def init_hidden(self, batch, device):
        z = torch.zeros(self.layers, batch, self.hidden, device=device)
        return (z, z.clone())


def parse_args(argv=None):
    p = argparse.ArgumentParser(description='Time a PyTorch LSTM language-model training step.')
    p.add_argument('--vocab', type=int, default=33278)
    p.add_argument('--hidden', type=int, default=650)
    p.add_argument('--layers', type=int, default=2)
    p.add_argument('--dropout', type=float, default=0.4)
    p.add_argument('--bptt', type=int, default=35)
    p.add_argument('--batch', type=int, default=20)
    p.add_argument('--clip', type=float, default=0.25)
    p.add_argument('--lr', type=float, default=2.5)
    timing.add_threads_arg(p)
    p.add_argument('--warmup', type=int, default=2)
    p.add_argument('--steps', type=int, default=5)
    p.add_argument('--forward-steps', type=int, default=None,
                   help='timed forward-only windows (default: --steps; 0 skips them)')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--device', choices=['cpu', 'cuda'], default='cpu')
    p.add_argument('--autocast', action='store_true', help="forward and loss under torch.autocast to bfloat16, as users train in bf16")
    args = p.parse_args(argv)
    timing.resolve_threads(p, args, _OMP)
    if args.forward_steps is None:
        args.forward_steps = args.steps
    if min(args.threads, args.batch, args.steps, args.bptt, args.hidden, args.layers) < 1 \
            or args.vocab < 2 or args.warmup < 0 or args.forward_steps < 0:
        p.error('--threads, --batch, --steps, --bptt, --hidden, --layers must be >= 1, '
                '--vocab >= 2, --warmup and --forward-steps >= 0')
    return args


def main(argv=None):
    args = parse_args(argv)
    timing.set_threads(args.threads, _OMP, args.seed)

    gpu = timing.on_gpu(args.device)
    model = RNNModel(args.vocab, args.hidden, args.layers, args.dropout).to(args.device)
    # parameters() yields the tied weight once, which is what the engine counts.
    params = list(model.parameters())
    param_count = sum(p.numel() for p in params)
    opt = torch.optim.SGD(params, lr=args.lr, momentum=0.9, nesterov=True, weight_decay=0)
    criterion = nn.CrossEntropyLoss()

    # A random token stream batchified like the example (column = one stream, time-major), one
    # fresh window per step: the embedding rows touched change from step to step as in training.
    windows = args.warmup + max(args.steps, args.forward_steps)
    stream = torch.randint(0, args.vocab, (windows * args.bptt + 1, args.batch)).to(args.device)

    def window(i):
        s = (i % windows) * args.bptt
        return stream[s:s + args.bptt], stream[s + 1:s + 1 + args.bptt].reshape(-1)

    hidden = model.init_hidden(args.batch, args.device)

    def train_step(i):
        nonlocal hidden
        x, y = window(i)
        # Truncated BPTT: the state crosses windows, its graph does not.
        hidden = tuple(h.detach() for h in hidden)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.autocast):
            out, hidden = model(x, hidden)
            loss = criterion(out, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, args.clip)
        opt.step()
        if gpu:
            torch.cuda.synchronize()
        return loss

    model.train()
    seconds, loss = timing.time_steps(train_step, args.warmup, args.steps, gpu=gpu)
    timing.warn_if_diverged(loss)

    forward_times = []
    model.eval()
    # Evaluated as trained: under autocast the LSTM returns its state in reduced precision, which it reads back
    # only under autocast.
    with torch.no_grad(), torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.autocast):
        for i in range(args.forward_steps):
            x, y = window(args.warmup + i)
            t0 = time.perf_counter()
            out, hidden = model(x, hidden)
            criterion(out, y).item()
            forward_times.append((time.perf_counter() - t0) * 1e3)

    print(json.dumps({
        'peer': 'pytorch',
        'torch': torch.__version__,
        'model': 'lstm',
        'vocab': args.vocab,
        'hidden': args.hidden,
        'layers': args.layers,
        'bptt': args.bptt,
        'batch': args.batch,
        'threads': args.threads,
        'warmup': args.warmup,
        'steps': args.steps,
        'parameters': param_count,
        'loss': round(loss.item(), 4),
        **timing.step_figures(seconds),
        'forward_ms_median': round(statistics.median(forward_times), 3) if forward_times else None,
        'forward_ms_all': [round(t, 3) for t in forward_times],
        'mkldnn': torch.backends.mkldnn.is_available(),
        'device': torch.cuda.get_device_name() if gpu else 'cpu',
        'cudnn': torch.backends.cudnn.version() if gpu else None,
        'peak_memory_bytes': torch.cuda.max_memory_allocated() if gpu else None,
    }))
    return 0


if __name__ == '__main__':
    sys.exit(main())
