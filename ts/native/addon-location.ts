/**
 * Where the native addon comes from, in order: the package's own build (`build/Release`, made in a
 * checkout or by `npm install --build-from-source`), then the platform package of this machine
 * (`@accordion-engine/linux-x64-gnu`: the addon with the libraries it needs beside it, found
 * through $ORIGIN). The platform package records the glibc and libstdc++ versions its files need;
 * a system older than that is refused with both versions named, before the loader's own message.
 */
import { existsSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { NativeError } from '../base/errors.js';

/** The package root (the folder of package.json). */
export const PACKAGE_ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');

/** The platform package for this machine's platform and architecture (glibc builds). */
export const PLATFORM_PACKAGE = `@accordion-engine/${process.platform}-${process.arch}-gnu`;

export interface AddonSource {
  kind: 'build' | 'platform package';
  /** The folder node-gyp-build resolves the addon in. */
  dir: string;
  /** The addon file itself. */
  file: string;
}

export interface PlatformRequirements {
  glibc?: string;
  glibcxx?: string;
}

const require = createRequire(import.meta.url);
type Loader = ((dir: string) => unknown) & { path(dir: string): string };

/** The platform package's folder, or undefined where it is not installed. */
function platformPackageDir(): string | undefined {
  try {
    return dirname(require.resolve(`${PLATFORM_PACKAGE}/package.json`, { paths: [PACKAGE_ROOT] }));
  } catch {
    return undefined;
  }
}

/** Compares dotted versions: negative when a < b. */
function compareVersions(a: string, b: string): number {
  const [x, y] = [a.split('.').map(Number), b.split('.').map(Number)];
  for (let i = 0; i < Math.max(x.length, y.length); i++) if ((x[i] ?? 0) !== (y[i] ?? 0)) return (x[i] ?? 0) - (y[i] ?? 0);
  return 0;
}

/** Refuses a system whose glibc is older than the platform package needs. */
export function checkGlibc(dir: string, needs: PlatformRequirements): void {
  const report = process.report?.getReport() as { header?: { glibcVersionRuntime?: string } } | undefined;
  const runtime = report?.header?.glibcVersionRuntime;
  if (needs.glibc && runtime && compareVersions(runtime, needs.glibc) < 0)
    throw new NativeError(
      'ERR_GLIBC',
      `the prebuilt addon in ${dir} needs glibc ${needs.glibc} or newer (and libstdc++ with GLIBCXX_${needs.glibcxx}); this system has glibc ${runtime}. ` +
        'Build it from source instead: npm install accordion-engine --build-from-source (needs cmake, g++ and the -dev packages of oneDNN, OpenBLAS and Gloo)',
    );
}

/** The addon: the package's own build, else the platform package's; with where it came from. */
export function loadAddon<T>(): { addon: T; source: AddonSource } {
  const build = require('node-gyp-build') as Loader;
  if (existsSync(join(PACKAGE_ROOT, 'build', 'Release', 'accordion.node'))) {
    const file = build.path(PACKAGE_ROOT);
    return { addon: require(file) as T, source: { kind: 'build', dir: PACKAGE_ROOT, file } };
  }
  const dir = platformPackageDir();
  if (!dir)
    throw new NativeError(
      'ERR_ADDON_MISSING',
      `the native addon is neither built (${join(PACKAGE_ROOT, 'build', 'Release', 'accordion.node')}) nor installed as ${PLATFORM_PACKAGE}. ` +
        'Reinstall the package (npm install accordion-engine), or build it from source with the system libraries: npm run setup',
    );
  const needs = ((JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8')) as { accordion?: PlatformRequirements }).accordion ?? {});
  checkGlibc(dir, needs);
  const file = build.path(dir);
  try {
    return { addon: require(file) as T, source: { kind: 'platform package', dir, file } };
  } catch (err) {
    const message = (err as Error).message;
    const missing = /version `(GLIBC(?:XX)?_[\d.]+)' not found/.exec(message);
    if (missing)
      throw new NativeError(
        'ERR_GLIBC',
        `the prebuilt addon ${file} needs ${missing[1]} (it is built for glibc ${needs.glibc ?? '?'} and GLIBCXX_${needs.glibcxx ?? '?'}), which this system's libraries lack. ` +
          'Build it from source instead: npm install accordion-engine --build-from-source',
      );
    throw err;
  }
}
