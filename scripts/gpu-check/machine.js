// What the GPU machine offers the check: the carried build (does it load? a rebuild with the
// machine's compiler when not), cuda:0 as kernel_check sees it, the libraries the engine finds,
// pip's NVIDIA packages and compute-sanitizer. Two environments: the runtime's for what runs from
// it (node, kernel_check) and the machine's own for its tools (nvcc, cmake, python3, nvidia-smi).
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';

export const REPO = path.resolve(path.dirname(new URL(import.meta.url).pathname), '..', '..');
export const KERNEL_CHECK = path.join(REPO, 'build', 'Release', 'kernel_check');

/** The runtime's environment (as run.sh set it) and the machine's own. */
export const rtEnv = () => process.env;
export function machineEnv() {
  const env = { ...process.env };
  if (process.env.ACCORDION_SYSTEM_LD_LIBRARY_PATH) env.LD_LIBRARY_PATH = process.env.ACCORDION_SYSTEM_LD_LIBRARY_PATH;
  else delete env.LD_LIBRARY_PATH;
  return env;
}

/** A command's status and output, at once (for short probes). */
export function quick(command, args, { env = rtEnv(), seconds = 30 } = {}) {
  const r = spawnSync(command, args, { env, encoding: 'utf8', timeout: seconds * 1000, cwd: REPO });
  return { status: r.error ? 127 : r.status ?? 124, output: `${r.stdout ?? ''}${r.stderr ?? ''}` };
}
const which = (name) => quick('sh', ['-c', `command -v ${name}`], { env: machineEnv() }).output.trim();

export const runtimeSha = () => process.env.ACCORDION_RUNTIME_SHA ?? '';
export const buildOrigin = () => (fs.readFileSync(path.join(REPO, 'build', '.runtime-sha256'), 'utf8').trim().endsWith('rebuilt') ? 'rebuilt here' : 'carried');

/** Whether build/Release loads and runs here: the addon in node, and kernel_check. */
export function buildLoads() {
  return quick(process.execPath, ['-e', "require('node-gyp-build')('.')"]).status === 0 && fs.existsSync(KERNEL_CHECK) && quick(KERNEL_CHECK, ['--self-check']).status === 0;
}

/** Builds with the machine's compiler into build-gpu/ and copies the addon and kernel_check into build/Release. */
export async function rebuild(out, seconds) {
  const runtime = process.env.ACCORDION_RUNTIME;
  out.say(`== rebuilding with the machine's compiler (${which('nvcc') || 'no nvcc'}, ${quick('cmake', ['--version'], { env: machineEnv() }).output.split('\n')[0]})`);
  out.row({ event: 'rebuild', reason: 'the carried build does not load here' });
  const started = Date.now();
  const left = () => seconds - (Date.now() - started) / 1000;
  const configure = await out.run('cmake', ['-S', '.', '-B', 'build-gpu', '-DCMAKE_BUILD_TYPE=Release', '-DACCORDION_CUDA=ON', `-DCMAKE_PREFIX_PATH=${runtime}`,
    `-DCMAKE_INCLUDE_PATH=${runtime}/include`, `-DCMAKE_LIBRARY_PATH=${runtime}/lib`,
    `-DCMAKE_JS_INC=${REPO}/node_modules/node-api-headers/include;${REPO}/node_modules/node-addon-api`, `-DCMAKE_LIBRARY_OUTPUT_DIRECTORY=${REPO}/build-gpu/Release`], { env: machineEnv(), seconds: left() });
  const build = configure.status === 0 && (await out.run('cmake', ['--build', 'build-gpu', '-j', String(os.cpus().length)], { env: machineEnv(), seconds: left() }));
  if (!build || build.status !== 0) {
    out.say('gpu-check: the rebuild failed');
    out.row({ event: 'rebuild failed' });
    return false;
  }
  for (const f of ['accordion.node', 'kernel_check']) fs.copyFileSync(path.join(REPO, 'build-gpu', 'Release', f), path.join(REPO, 'build', 'Release', f));
  fs.writeFileSync(path.join(REPO, 'build', '.runtime-sha256'), `${runtimeSha()} rebuilt\n`);
  out.say(`gpu-check: rebuilt into build/Release; C++ runtime: ${process.env.ACCORDION_CXX_CHOICE ?? ''}`);
  out.row({ event: 'rebuilt', cxx: process.env.ACCORDION_CXX_CHOICE ?? '' });
  return true;
}

/** cuda:0 as kernel_check sees it after one kernel ran there: { device } (its JSON) or { noDevice } (why not). */
export function checkDevice() {
  if (fs.existsSync(KERNEL_CHECK) && quick(KERNEL_CHECK, ['--self-check']).status === 0) {
    const r = quick(KERNEL_CHECK, ['--device-info']);
    if (r.status === 0) return { device: JSON.parse(r.output) };
    const why = /kernel_check: cuda:0 is not usable: (.*)/.exec(r.output)?.[1];
    return { noDevice: why ?? r.output.trim() };
  }
  // kernel_check cannot start (the carried build does not load): what the driver says.
  if (quick('nvidia-smi', ['-L'], { env: machineEnv() }).status === 0) return {};
  return { noDevice: `no NVIDIA driver found: nvidia-smi ${which('nvidia-smi') ? 'lists no GPU' : 'is not installed'}, and kernel_check cannot start here` };
}

/** The nvidia/ directories of python3's path, where pip puts NVIDIA's packages (nvidia-cudnn-cu13 …). */
export function nvidiaDirs() {
  const r = quick('python3', ['-c', 'import importlib.util as u; s = u.find_spec("nvidia"); print("\\n".join(s.submodule_search_locations))'], { env: machineEnv() });
  return r.status === 0 ? r.output.trim().split('\n').filter(Boolean) : [];
}

/** The first file named like `pattern` (find's -name) in pip's NVIDIA packages, or ''. */
export function findInNvidia(pattern) {
  const dirs = nvidiaDirs();
  if (!dirs.length) return '';
  return quick('find', [...dirs, '-maxdepth', '4', '-name', pattern], { env: machineEnv() }).output.trim().split('\n').filter(Boolean).sort()[0] ?? '';
}

/**
 * The libraries as the engine finds them by itself (`accordion info`); where it misses one, the
 * one pip has is named through ACCORDION_CUDNN and the like for what runs next. { found, set }.
 */
export function libraries() {
  let found = null;
  try {
    const devices = JSON.parse(quick(process.execPath, ['lib/cli.js', 'info']).output).devices;
    found = Object.fromEntries(['cudnn', 'cublas', 'nccl'].map((k) => [k, devices[k].loaded ? { found: true, path: devices[k].path, version: devices[k].version } : { found: false, error: devices[k].error.split('\n')[0] }]));
  } catch {
    // the engine does not load: nothing found
  }
  const set = [];
  for (const [lib, variable, pattern] of [['cudnn', 'ACCORDION_CUDNN', 'libcudnn.so.9'], ['cublas', 'ACCORDION_CUBLAS', 'libcublas.so.1[0-9]'], ['nccl', 'ACCORDION_NCCL', 'libnccl.so.2']]) {
    if (found?.[lib]?.found !== false) continue;
    const file = findInNvidia(pattern);
    if (file) {
      process.env[variable] = file;
      set.push(`${variable}=${file}`);
    }
  }
  return { found, set: set.join(' ') };
}

/** The op families kernel_check knows, from its --help. */
export function families() {
  const lines = quick(KERNEL_CHECK, ['--help']).output.split('\n');
  const at = lines.findIndex((l) => l.includes('--only NAMES'));
  return at < 0 ? [] : lines[at + 1].split(',').map((s) => s.trim()).filter(Boolean);
}

/** compute-sanitizer's path, or ''. */
export function sanitizerPath() {
  return which('compute-sanitizer') || ['/usr/local/cuda/bin/compute-sanitizer', '/usr/local/cuda/compute-sanitizer/compute-sanitizer'].find((f) => fs.existsSync(f)) || '';
}
