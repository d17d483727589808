// npm install hook: nothing to do where an addon loads (the platform package's prebuilt one, or a
// build already made); otherwise, or with `npm install --build-from-source`, builds the addon from
// source. Missing system libraries are named with the command that installs them.
const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');

const root = path.join(__dirname, '..');

function buildFromSource() {
  const headers = ['/usr/include/oneapi/dnnl/dnnl.hpp', '/usr/include/x86_64-linux-gnu/cblas.h', '/usr/include/cblas.h'];
  const hasDnnl = fs.existsSync(headers[0]);
  const hasBlas = headers.slice(1).some((h) => fs.existsSync(h)) || fs.existsSync('/usr/include/x86_64-linux-gnu/openblas-pthread/cblas.h');
  if (process.platform === 'linux' && (!hasDnnl || !hasBlas)) {
    console.error('accordion-engine: no prebuilt addon for this machine, and the system libraries oneDNN and OpenBLAS that a build from source needs are missing. Install them with:');
    console.error('  sudo apt-get install -y cmake g++ libdnnl-dev ocl-icd-opencl-dev libopenblas-dev libgloo-dev');
    console.error('or run: bash scripts/setup.sh');
    process.exit(1);
  }
  execFileSync(process.execPath, [require.resolve('cmake-js/bin/cmake-js'), 'compile', '--out', 'build'], { cwd: root, stdio: 'inherit' });
}

async function main() {
  if (process.env.npm_config_build_from_source !== 'true') {
    try {
      // lib/ is in the published package; a checkout has none before its first build.
      const { loadAddon } = await import(path.join(root, 'lib', 'native', 'addon-location.js'));
      const { source } = loadAddon();
      console.log(`accordion-engine: the native addon loads from ${source.file} (${source.kind})`);
      return;
    } catch (err) {
      if (err.code === 'ERR_GLIBC') console.error(`accordion-engine: ${err.message}`);
      // otherwise: not built yet, and no platform package for this machine; build below
    }
  }
  buildFromSource();
}

main().catch((err) => {
  console.error(err.message);
  process.exit(1);
});
