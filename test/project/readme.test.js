// The library's examples that are complete programs (docs/library.md) run as they stand, against this
// build; the option reference (docs/options.md) is the commands' option tables as they stand.
import { expect } from 'chai';
import { execFileSync, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { ROOT as root } from '../helpers/paths.js';

/** The first ```js block of `page` after the paragraph that starts with `lead`. */
function codeAfter(page, lead) {
  const text = fs.readFileSync(path.join(root, page), 'utf8');
  const at = text.indexOf(lead);
  if (at < 0) throw new Error(`${page} has no paragraph starting '${lead}'`);
  const match = /```js\n([\s\S]*?)```/.exec(text.slice(at));
  if (!match) throw new Error(`${page} has no js block after '${lead}'`);
  return match[1];
}

describe('the documentation', function () {
  this.timeout(300000);

  it('training on in-memory data runs and its loss falls', function () {
    // Run from the package root, so that `import … from 'accordion-engine'` resolves to this package.
    const out = execFileSync(process.execPath, ['--input-type=module', '-'], { cwd: root, input: codeAfter('docs/library.md', 'Training on in-memory data'), encoding: 'utf8' });
    const losses = [...out.matchAll(/^step \d: loss ([\d.]+), (\d+)\/16 correct$/gm)].map((m) => Number(m[1]));
    expect(losses).to.have.length(3);
    expect(losses[2]).to.be.below(losses[0]);
    expect(out).to.match(/^conv1\.weight gradient \[ 64, 3, 3, 3 \]$/m);
    expect(out).to.match(/^lstm: loss [\d.]+$/m);
    expect(out).to.match(/^32 positions; 2 layers of carried state$/m);
  });

  it('docs/options.md is every command\'s option table as it stands', function () {
    const r = spawnSync(process.execPath, [path.join(root, 'scripts', 'options-doc.js'), '--check'], { encoding: 'utf8' });
    expect(r.status, r.stderr).to.equal(0);
  });
});
