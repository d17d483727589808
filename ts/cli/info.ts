/**
 * `accordion info`: how the addon was built, the devices it sees, the launcher this process would
 * train under, and how the threads are shared out.
 */
import { UsageError } from '../base/errors.js';
import { describeLaunch } from '../comm/environment.js';
import { distributedEnv } from '../comm/group.js';

const INFO_USAGE = `Usage: accordion info

Prints, as JSON: how the native addon was built (oneDNN, OpenBLAS, Gloo, CUDA and its libraries),
where the addon and each shared library were loaded from (the package's own build or its platform
package; the system), the CPU's features (AVX2, AVX-512, AVX512-BF16, AMX), the devices it sees, the
launcher this process would train under, and how the threads are shared between compute and
communication.`;

export async function info(argv: string[] = []): Promise<void> {
  if (argv.includes('--help') || argv.includes('-h')) {
    process.stdout.write(INFO_USAGE + '\n');
    return;
  }
  if (argv.length) throw new UsageError(`unknown info option ${argv[0]}\n${INFO_USAGE}`);
  const { addonSource, binding } = await import('../native/binding.js');
  const { cpuFeatures, loadedLibraries } = await import('../native/runtime-facts.js');
  // The launcher this process would train under, or why its environment is not usable.
  let job: string;
  try {
    job = describeLaunch(distributedEnv());
  } catch (err) {
    if (!(err instanceof UsageError)) throw err;
    job = `error: ${err.message}`;
  }
  // The thread budget (--threads, else OMP_NUM_THREADS or every core) and how a model shares it out.
  const total = Number(process.env.OMP_NUM_THREADS) || binding.buildInfo().threads;
  const threads = {
    total,
    overlapped: { compute: Math.max(1, total - 1), communication: 1 },
    alone: { compute: total, communication: 0 },
    rule: 'an image model on the CPU with 2 or more workers and --bucket-mb > 0 (the default) overlaps its exchange with backward: one thread communicates, the others compute; otherwise all compute',
  };
  // NCCL's load failure (every path tried) is shown once, under devices.nccl.
  const build = binding.buildInfo();
  const devices = binding.deviceQuery();
  if (build.cuda.nccl !== true) build.cuda.nccl = 'not loaded: see devices.nccl.error';
  const loaded = { addon: addonSource, libraries: loadedLibraries() };
  process.stdout.write(JSON.stringify({ build, loaded, cpu: cpuFeatures(), devices, job, threads }, null, 2) + '\n');
}
