// The README's library examples that are complete programs run as they stand, against this build.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

/** The first ```js block after the paragraph that starts with `lead`. */
function codeAfter(lead) {
  const readme = fs.readFileSync(path.join(root, 'README.md'), 'utf8');
  const at = readme.indexOf(lead);
  if (at < 0) throw new Error(`README.md has no paragraph starting '${lead}'`);
  const match = /```js\n([\s\S]*?)```/.exec(readme.slice(at));
  if (!match) throw new Error(`README.md has no js block after '${lead}'`);
  return match[1];
}

describe('README examples', function () {
  this.timeout(300000);

  it('training on in-memory data runs and its loss falls', function () {
    // Run from the package root, so that `import … from 'accordion-engine'` resolves to this package.
    const out = execFileSync(process.execPath, ['--input-type=module', '-'], { cwd: root, input: codeAfter('Training on in-memory data'), encoding: 'utf8' });
    const losses = [...out.matchAll(/^step \d: loss ([\d.]+), (\d+)\/16 correct$/gm)].map((m) => Number(m[1]));
    expect(losses).to.have.length(3);
    expect(losses[2]).to.be.below(losses[0]);
    expect(out).to.match(/^conv1\.weight gradient \[ 64, 3, 3, 3 \]$/m);
    expect(out).to.match(/^lstm: loss [\d.]+$/m);
    expect(out).to.match(/^32 positions; 2 layers of carried state$/m);
  });
});
