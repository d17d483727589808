#!/usr/bin/env node
// The two packages a release publishes, as npm tarballs in OUT (default dist/):
//   - @accordion-engine/linux-x64-gnu: the built addon (prebuilds/linux-x64/node.napi.glibc.node, as
//     node-gyp-build looks for it) with every shared library it needs beside it (oneDNN, OpenBLAS,
//     Gloo and what they pull in), each stripped and found through $ORIGIN, the Debian copyright
//     file of each bundled library under LICENSES/, and in package.json the glibc and GLIBCXX
//     versions its files need (ts/native/addon-location.ts refuses an older system);
//   - accordion-engine: `npm pack` of this repository, its package.json listing the first as an
//     optional dependency of the same version (the repository's own manifest does not: its lockfile
//     installs from source).
// Only glibc, libstdc++ and libgcc are left to the system. Needs patchelf, strip, ldd, objdump, dpkg.
//
//   node scripts/platform-package.js [--addon build/Release/accordion.node] [--out dist]
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

const ROOT = path.join(path.dirname(fileURLToPath(import.meta.url)), '..');
const PLATFORM = '@accordion-engine/linux-x64-gnu';
/** Left to the system: the C library, the C++ runtime and the dynamic loader. */
const SYSTEM = /^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|libstdc\+\+\.so|libgcc_s\.so)/;
const MAX_PACKED_BYTES = 40e6;

const run = (cmd, args, options = {}) => execFileSync(cmd, args, { encoding: 'utf8', ...options });

/** The shared libraries `file` needs, as { soname → resolved path }, from ldd; a missing one is an error naming it. */
function sharedLibraries(file) {
  const out = new Map();
  for (const line of run('ldd', [file]).split('\n')) {
    const m = /^\s*(\S+) => (\S+|not found)/.exec(line);
    if (!m) continue;
    if (m[2] === 'not found') throw new Error(`${file} needs ${m[1]}, which this system does not have`);
    if (!SYSTEM.test(m[1])) out.set(m[1], m[2]);
  }
  return out;
}

/** The newest GLIBC_ and GLIBCXX_ versions the files' dynamic symbols ask for. */
function requiredVersions(files) {
  const newest = { glibc: '0', glibcxx: '0' };
  const later = (a, b) => (a.split('.').map(Number).reduce((c, x, i) => c || x - (b.split('.').map(Number)[i] ?? 0), 0) > 0 ? a : b);
  for (const f of files)
    for (const m of run('objdump', ['-T', f], { maxBuffer: 1 << 28 }).matchAll(/\b(GLIBC|GLIBCXX)_(\d+(?:\.\d+)+)\b/g)) {
      const key = m[1] === 'GLIBC' ? 'glibc' : 'glibcxx';
      newest[key] = later(m[2], newest[key]);
    }
  return newest;
}

/** The Debian package that installed `file`, or undefined. */
function debianPackage(file) {
  for (const candidate of [file, fs.realpathSync(file)]) {
    try {
      return run('dpkg', ['-S', candidate], { stdio: ['ignore', 'pipe', 'ignore'] }).split(':')[0].trim();
    } catch {
      // not this path: dpkg knows files by the path their package installed
    }
  }
  return undefined;
}

function main() {
  const { values } = parseArgs({ options: { addon: { type: 'string', default: path.join(ROOT, 'build', 'Release', 'accordion.node') }, out: { type: 'string', default: path.join(ROOT, 'dist') } } });
  const addon = path.resolve(values.addon);
  const out = path.resolve(values.out);
  if (!fs.existsSync(addon)) throw new Error(`${addon} does not exist: build the addon first (npm run build)`);
  const manifest = JSON.parse(fs.readFileSync(path.join(ROOT, 'package.json'), 'utf8'));
  const stage = path.join(out, 'linux-x64-gnu');
  const prebuilds = path.join(stage, 'prebuilds', 'linux-x64');
  fs.rmSync(stage, { recursive: true, force: true });
  fs.mkdirSync(prebuilds, { recursive: true });
  fs.mkdirSync(path.join(stage, 'LICENSES'));

  // The closure of the addon's libraries, each copied under its soname.
  const bundled = new Map();
  const pending = [...sharedLibraries(addon)];
  while (pending.length) {
    const [soname, file] = pending.pop();
    if (bundled.has(soname)) continue;
    bundled.set(soname, file);
    pending.push(...sharedLibraries(file));
  }
  const target = path.join(prebuilds, 'node.napi.glibc.node');
  fs.copyFileSync(addon, target);
  const copies = [target];
  for (const [soname, file] of bundled) {
    const copy = path.join(prebuilds, soname);
    fs.copyFileSync(fs.realpathSync(file), copy);
    copies.push(copy);
  }
  for (const f of copies) {
    fs.chmodSync(f, 0o755);
    run('strip', ['--strip-unneeded', f]);
    run('patchelf', ['--set-rpath', '$ORIGIN', f]);
  }
  // Every library the copies need now resolves beside them.
  for (const [soname, file] of sharedLibraries(target))
    if (path.dirname(file) !== prebuilds) throw new Error(`the packaged addon still loads ${soname} from ${file}`);

  const licences = new Map();
  for (const [soname, file] of bundled) {
    const pkg = debianPackage(file);
    const copyright = pkg && `/usr/share/doc/${pkg.replace(/:.*$/, '')}/copyright`;
    if (!copyright || !fs.existsSync(copyright)) throw new Error(`no licence found for ${soname} (${file}, package ${pkg ?? 'unknown'})`);
    fs.copyFileSync(copyright, path.join(stage, 'LICENSES', `${pkg}.copyright`));
    licences.set(soname, pkg);
  }
  const needs = requiredVersions(copies);
  fs.writeFileSync(
    path.join(stage, 'package.json'),
    JSON.stringify(
      {
        name: PLATFORM,
        version: manifest.version,
        description: `The native addon of accordion-engine for Linux x64 (glibc ${needs.glibc} or newer), with the libraries it needs`,
        license: 'SEE LICENSE IN LICENSES',
        os: ['linux'],
        cpu: ['x64'],
        libc: ['glibc'],
        files: ['prebuilds', 'LICENSES', 'README.md'],
        accordion: needs,
      },
      null,
      2,
    ) + '\n',
  );
  fs.writeFileSync(
    path.join(stage, 'README.md'),
    `# ${PLATFORM}\n\nThe native addon of [accordion-engine](https://www.npmjs.com/package/accordion-engine) ${manifest.version} for Linux on x64 with glibc ` +
      `${needs.glibc} or newer and a libstdc++ with GLIBCXX_${needs.glibcxx}, installed with it as an optional dependency. It bundles, each under its ` +
      `Debian package's licence (LICENSES/):\n\n${[...licences].map(([soname, pkg]) => `- ${soname} (${pkg})`).join('\n')}\n`,
  );
  const platformTarball = path.join(out, run('npm', ['pack', '--silent', '--pack-destination', out], { cwd: stage }).trim().split('\n').at(-1));

  // The main package, its manifest naming the platform package.
  const main = path.join(out, 'main');
  fs.rmSync(main, { recursive: true, force: true });
  fs.mkdirSync(main, { recursive: true });
  const packed = path.join(main, run('npm', ['pack', '--silent', '--pack-destination', main], { cwd: ROOT }).trim().split('\n').at(-1));
  run('tar', ['-xzf', packed, '-C', main]);
  const mainManifest = path.join(main, 'package', 'package.json');
  const withPlatform = JSON.parse(fs.readFileSync(mainManifest, 'utf8'));
  withPlatform.optionalDependencies = { ...(withPlatform.optionalDependencies ?? {}), [PLATFORM]: manifest.version };
  fs.writeFileSync(mainManifest, JSON.stringify(withPlatform, null, 2) + '\n');
  const mainTarball = path.join(out, path.basename(packed));
  run('tar', ['-czf', mainTarball, '-C', main, 'package']);
  fs.rmSync(main, { recursive: true, force: true });

  const size = fs.statSync(platformTarball).size;
  console.log(`${platformTarball}: ${(size / 1e6).toFixed(1)} MB packed; bundles ${[...bundled.keys()].join(', ')}; needs glibc ${needs.glibc}, GLIBCXX_${needs.glibcxx}`);
  console.log(`${mainTarball}: ${(fs.statSync(mainTarball).size / 1e6).toFixed(1)} MB packed; optional dependency ${PLATFORM}@${manifest.version}`);
  if (size > MAX_PACKED_BYTES) throw new Error(`${platformTarball} is ${(size / 1e6).toFixed(1)} MB packed, more than ${MAX_PACKED_BYTES / 1e6} MB`);
}

try {
  main();
} catch (err) {
  console.error(`platform-package.js: ${err.message}`);
  process.exit(1);
}
