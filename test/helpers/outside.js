// What some tests need beyond the JavaScript: a text corpus kept in test/fixtures/, and the PyTorch
// and Chromium peers from Debian. A test that needs one of them fails, naming what is missing and
// how to get it, instead of being skipped: every test that can run without a GPU runs in CI.
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { ROOT } from './paths.js';


/** tinyshakespeare (1.1 MB, public domain), kept in the repository as test/fixtures/tinyshakespeare.txt. */
export const SHAKESPEARE = path.join(ROOT, 'test', 'fixtures', 'tinyshakespeare.txt');
const SHAKESPEARE_URL = 'https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt';

/** The text of tinyshakespeare; throws naming the file and where to get it when it is missing. */
export function readShakespeare() {
  if (!fs.existsSync(SHAKESPEARE))
    throw new Error(
      `this test reads ${SHAKESPEARE} (test/fixtures/tinyshakespeare.txt in the repository), which is missing: ` +
        `restore it from git (git checkout -- test/fixtures/tinyshakespeare.txt) or download the public-domain text from ${SHAKESPEARE_URL} and save it there`,
    );
  return fs.readFileSync(SHAKESPEARE, 'utf8');
}

/** Debian's python3 with python3-torch; ACCORDION_TEST_PYTHON names another (a GPU machine's PyTorch). */
export const PYTHON = process.env.ACCORDION_TEST_PYTHON || '/usr/bin/python3';

/** Throws naming the package to install unless PYTHON can import torch. */
export function requireTorch() {
  const r = spawnSync(PYTHON, ['-c', 'import torch'], { encoding: 'utf8', timeout: 120_000 });
  if (r.error || r.status !== 0) {
    const why = r.error ? r.error.message : (r.stderr || '').trim().split('\n').pop() || `exit ${r.status}`;
    throw new Error(`these tests need PyTorch for ${PYTHON} (${why}): install it with \`apt-get install python3-torch\` (scripts/setup.sh does as root)`);
  }
}

/** Debian's chromium, which opens the HTML report headless. */
export const CHROMIUM = '/usr/bin/chromium';

/** Throws naming the package to install unless Chromium is there. */
export function requireChromium() {
  if (!fs.existsSync(CHROMIUM))
    throw new Error(`this test opens the report in ${CHROMIUM}, which is missing: install it with \`apt-get install chromium\` (scripts/setup.sh does as root)`);
}

/** A typed array's bytes, in place. */
export const bytesOf = (a) => new Uint8Array(a.buffer, a.byteOffset, a.byteLength);

/** A tensor's data (as readSafetensors or stateDict give it) as float32 or float64 values, copied so that they are aligned. */
const copied = (t) => t.data.buffer.slice(t.data.byteOffset, t.data.byteOffset + t.data.byteLength);
export const float32Of = (t) => new Float32Array(copied(t));
export const float64Of = (t) => new Float64Array(copied(t));

/** Debian's dataset-fashion-mnist: the four *-ubyte.gz files as distributed. */
export const FASHION_MNIST = '/usr/share/datasets/fashion-mnist';

/** Throws naming the package to install unless Fashion-MNIST is there. */
export function requireFashionMnist() {
  if (!fs.existsSync(path.join(FASHION_MNIST, 'train-images-idx3-ubyte.gz')))
    throw new Error(`this test reads Fashion-MNIST from ${FASHION_MNIST}, which is missing: install it with \`apt-get install dataset-fashion-mnist\` (scripts/setup.sh does as root)`);
}
