/**
 * What this process runs with, read from Linux: the shared libraries mapped into it (where each was
 * loaded from: the system or the platform package) and the CPU's vector and matrix features.
 */
import { existsSync, readFileSync } from 'node:fs';
import { basename } from 'node:path';

/** The shared libraries mapped into this process, by file name, with the path each was loaded from. */
export function loadedLibraries(): Record<string, string> {
  if (!existsSync('/proc/self/maps')) return {};
  const out: Record<string, string> = {};
  for (const line of readFileSync('/proc/self/maps', 'utf8').split('\n')) {
    const file = line.slice(line.indexOf('/'));
    if (line.includes('/') && /\.so(\.[\d.]+)?$|\.node$/.test(file)) out[basename(file)] = file;
  }
  return out;
}

/** The CPU features the kernels choose by, as /proc/cpuinfo lists them (false where it does not). */
export function cpuFeatures(): Record<'avx2' | 'avx512f' | 'avx512_bf16' | 'amx_bf16' | 'amx_tile', boolean> {
  const flags = new Set(
    existsSync('/proc/cpuinfo') ? (/^flags\s*:(.*)$/m.exec(readFileSync('/proc/cpuinfo', 'utf8'))?.[1] ?? '').trim().split(/\s+/) : [],
  );
  return {
    avx2: flags.has('avx2'),
    avx512f: flags.has('avx512f'),
    avx512_bf16: flags.has('avx512_bf16'),
    amx_bf16: flags.has('amx_bf16'),
    amx_tile: flags.has('amx_tile'),
  };
}
