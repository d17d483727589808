// npm install hook: builds the native addon unless a build for this platform already loads.
// Missing system libraries are named with the command that installs them.
const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');

const root = path.join(__dirname, '..');
try {
  require('node-gyp-build')(root);
  process.exit(0);
} catch {
  // not built yet (or built for another platform): build below
}

const headers = ['/usr/include/oneapi/dnnl/dnnl.hpp', '/usr/include/x86_64-linux-gnu/cblas.h', '/usr/include/cblas.h'];
const hasDnnl = fs.existsSync(headers[0]);
const hasBlas = headers.slice(1).some((h) => fs.existsSync(h)) || fs.existsSync('/usr/include/x86_64-linux-gnu/openblas-pthread/cblas.h');
if (process.platform === 'linux' && (!hasDnnl || !hasBlas)) {
  console.error('accordion-engine: the system libraries oneDNN and OpenBLAS are missing. Install them with:');
  console.error('  sudo apt-get install -y cmake g++ libdnnl-dev ocl-icd-opencl-dev libopenblas-dev libgloo-dev');
  console.error('or run: bash scripts/setup.sh');
  process.exit(1);
}
execFileSync(process.execPath, [require.resolve('cmake-js/bin/cmake-js'), 'compile', '--out', 'build'], {
  cwd: root,
  stdio: 'inherit',
});
