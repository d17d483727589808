/**
 * Where a model trains: 'cpu', or a CUDA GPU ('cuda' is device 0, 'cuda:N' device N). Whether a GPU
 * can run a model (driver, device, cuDNN, cuBLAS) is the addon's verdict, asked before a run loads
 * its data so that it fails at once, naming the cause.
 */
import { binding, asNativeError } from './binding.js';
import { UsageError } from '../base/errors.js';

export type DeviceName = 'cpu' | 'cuda' | `cuda:${number}`;

/** Validates a device name; `what` names the option in the error. */
export function parseDevice(value: unknown, what = 'device'): DeviceName {
  if (typeof value === 'string' && /^(cpu|cuda|cuda:\d{1,3})$/.test(value)) return value as DeviceName;
  throw new UsageError(`${what}: expected cpu, cuda or cuda:N, got '${String(value)}'`);
}

/**
 * Throws a NativeError unless a model can run on `device`: ERR_NO_CUDA (the addon was built without
 * CUDA), ERR_NO_CUDA_DEVICE (no NVIDIA driver, one older than the build's CUDA, no such device, too
 * old a GPU) or ERR_CUDA_LIBRARY (cuDNN or cuBLAS not found, with every path tried; pip's wheels are
 * found without environment variables). A GPU it accepts becomes the process's GPU: the pinned host
 * memory of batches assembled afterwards is allocated there, so a worker on GPU N never creates a
 * context on GPU 0.
 */
export function requireDevice(device: DeviceName): void {
  try {
    binding.checkDevice(device);
  } catch (err) {
    throw asNativeError(err);
  }
}

/**
 * The GPU of one worker of a job. NCCL runs one rank per GPU, so 'cuda' means GPU LOCAL_RANK; a
 * pinned 'cuda:N' is for a single worker per host, and a host with fewer GPUs than workers is a
 * usage error naming both counts. Over Gloo ('gloo') workers may share GPUs: 'cuda' means GPU
 * LOCAL_RANK modulo the host's GPUs, and 'cuda:N' pins them all to GPU N.
 */
export function workerDevice(device: DeviceName, job: { rank: number; localRank: number; worldSize: number }, distBackend: 'nccl' | 'gloo' = 'nccl'): DeviceName {
  if (device === 'cpu' || job.worldSize === 1) return device;
  if (distBackend === 'gloo') return device === 'cuda' ? `cuda:${job.localRank % Math.max(1, binding.deviceQuery().count)}` : device;
  if (device !== 'cuda') {
    if (job.localRank > 0)
      throw new UsageError(
        `--device ${device} pins every worker of a host to one GPU, and NCCL runs one rank per GPU: use --device cuda (worker LOCAL_RANK takes GPU LOCAL_RANK), or share the GPU over Gloo (--dist-backend gloo)`,
      );
    return device;
  }
  // With no GPU at all, requireDevice names the cause (no driver, no device).
  const gpus = binding.deviceQuery().count;
  if (gpus > 0 && job.localRank >= gpus)
    throw new UsageError(
      `rank ${job.rank} is worker ${job.localRank} of its host (LOCAL_RANK), which has ${gpus} GPU(s): NCCL runs one rank per GPU, so start at most ${gpus} worker(s) per host (or share GPUs over Gloo: --dist-backend gloo)`,
    );
  return `cuda:${job.localRank}`;
}
