"""Setting up and timing a PyTorch peer's steps: the thread count from
OMP_NUM_THREADS (checked before torch loads), fp32 on a GPU, the Gloo group of
a distributed peer, and warm-up then timed steps with their summary in
milliseconds.

torch is imported inside the functions only, so that a peer can import this
module and call require_omp() before its own `import torch`.
"""

import os
import statistics
import sys
import time


def require_omp(script, example):
    """OMP_NUM_THREADS, or exit naming `script` where it is unset. OpenMP sizes
    its pool from it when torch is loaded, so a peer calls this before importing
    torch: set_num_threads alone would leave the pool sized by the shell."""
    omp = os.environ.get('OMP_NUM_THREADS')
    if not omp:
        sys.exit(f'{script}: OMP_NUM_THREADS must be set (e.g. OMP_NUM_THREADS={example})')
    return omp


def add_threads_arg(p):
    p.add_argument('--threads', type=int, default=None,
                   help='torch.set_num_threads value (default: OMP_NUM_THREADS)')


def resolve_threads(p, args, omp):
    """Defaults args.threads to OMP_NUM_THREADS (`omp`); an argparse error where that is no integer."""
    if args.threads is None:
        try:
            args.threads = int(omp)
        except ValueError:
            p.error(f'OMP_NUM_THREADS={omp!r} is not an integer; pass --threads')


def set_threads(threads, omp, seed):
    """torch's thread count and seed, with a warning where OMP_NUM_THREADS (`omp`) says otherwise."""
    import torch
    if omp != str(threads):
        print(f'warning: OMP_NUM_THREADS={omp} but --threads={threads}; '
              'the OpenMP pool and torch may disagree', file=sys.stderr)
    torch.set_num_threads(threads)
    torch.manual_seed(seed)


def on_gpu(device, benchmark=False, tf32=False):
    """Whether `device` is a GPU. There TF32 is turned off for cuBLAS and cuDNN
    (fp32, as the engine computes) unless `tf32`, and with `benchmark` cuDNN
    chooses its algorithms by timing them."""
    import torch
    gpu = device == 'cuda'
    if gpu:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        if benchmark:
            torch.backends.cudnn.benchmark = True
    return gpu


def add_group_args(p):
    """--rank, --world and --master: this worker's place in a distributed peer's Gloo group."""
    p.add_argument('--rank', type=int, required=True)
    p.add_argument('--world', type=int, required=True)
    p.add_argument('--master', required=True, help='address:port of rank 0')


def join_group(args):
    """torch's threads from OMP_NUM_THREADS, then this worker's Gloo group (rank 0 at args.master)."""
    import torch
    import torch.distributed as dist
    torch.set_num_threads(int(os.environ['OMP_NUM_THREADS']))
    dist.init_process_group('gloo', init_method=f'tcp://{args.master}', rank=args.rank, world_size=args.world)


def time_steps(step, warmup, steps, gpu=False, before=None):
    """Calls step(i) for i = 0 … warmup + steps − 1, the first `warmup` calls
    untimed; `before()`, where given, runs ahead of every call outside its time.
    On a GPU the peak-memory counter restarts after the warm-up. Returns the
    timed calls' seconds and the last call's result."""
    import torch
    seconds = []
    result = None
    for i in range(warmup + steps):
        if i == warmup and gpu:
            torch.cuda.reset_peak_memory_stats()
        if before is not None:
            before()
        t0 = time.perf_counter()
        result = step(i)
        if i >= warmup:
            seconds.append(time.perf_counter() - t0)
    return seconds, result


def warn_if_diverged(loss):
    """A diverging run would mean the step is not doing what the engine does."""
    import torch
    if not torch.isfinite(loss):
        print(f'warning: non-finite loss {loss.item()}', file=sys.stderr)


def step_figures(seconds):
    """The timed steps in ms, as the bench reads them: median, minimum and all, to 3 decimals."""
    ms = [s * 1e3 for s in seconds]
    return {
        'step_ms_median': round(statistics.median(ms), 3),
        'step_ms_min': round(min(ms), 3),
        'step_ms_all': [round(t, 3) for t in ms],
    }
