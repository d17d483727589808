// The layering (docs/architecture.md), checked by scripts/check-layers.js over the TypeScript's imports,
// the native code's includes and the layout of the tests and scripts; and the check itself, on files
// that break each rule.
import { expect } from 'chai';
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { ROOT } from '../helpers/paths.js';

const SCRIPT = path.join(ROOT, 'scripts', 'check-layers.js');
const run = () => spawnSync(process.execPath, [SCRIPT], { encoding: 'utf8' });

/**
 * Runs the check with `files` (paths from the repository → text) planted, each removed afterwards
 * with the folders made for it.
 */
function runWithPlanted(files) {
  const made = [];
  try {
    for (const [rel, text] of Object.entries(files)) {
      const file = path.join(ROOT, rel);
      if (!fs.existsSync(path.dirname(file))) made.push(path.dirname(file));
      fs.mkdirSync(path.dirname(file), { recursive: true });
      fs.writeFileSync(file, text);
    }
    return run();
  } finally {
    for (const rel of Object.keys(files)) fs.rmSync(path.join(ROOT, rel), { force: true });
    for (const dir of made) fs.rmSync(dir, { recursive: true, force: true });
  }
}

describe('the layering check', function () {
  it('passes on the repository, naming each rule it holds', function () {
    const r = run();
    expect(r.status, r.stderr).to.equal(0);
    expect(r.stdout).to.include('every import points down, no cycles, every file opens with its concern');
    expect(r.stdout).to.include('cpp/, cuda/: core → lib → comm | ops | data → compress → models → train → napi | lab: every include points down');
    expect(r.stdout).to.include('test/, scripts/: suites in');
  });

  // Each case plants files that break its rules; the check must exit 1 and name each break.
  const cases = [
    {
      title: 'ts/: names a file that imports upward, an import cycle and a file without its opening comment',
      // Two files in base/ (the lowest layer).
      files: {
        'ts/base/zz-upward.ts': "/** breaks the layering, for the test */\nimport { Trainer } from '../train/trainer.js';\nimport { x } from './zz-back.js';\nexport const y = [Trainer, x];\n",
        'ts/base/zz-back.ts': "import { y } from './zz-upward.js';\nexport const x = y;\n",
      },
      named: [
        "base/zz-upward.ts: imports '../train/trainer.js' (train/trainer.ts), a layer above its own",
        /import cycle: base\/zz-(upward|back)\.ts → base\/zz-(upward|back)\.ts → /,
        'base/zz-back.ts: does not open with a comment naming its concern',
      ],
    },
    {
      title: 'cpp/, cuda/: names a file that includes a level above its own, one that includes a folder of its own level, and a folder that is no level',
      // ops/ including compress/ (above) and comm/ (its level).
      files: {
        'cpp/ops/zz_broken.h': '// breaks the levels, for the test\n#pragma once\n#include "compress/reducer.h"\n#include "comm/process_group.h"\n#include <vector>\n',
        'cuda/zz_stray/x.cu': '// in a folder that is no level\n#include "core/tensor.h"\n',
      },
      named: [
        'cpp/ops/zz_broken.h: includes "compress/reducer.h", a level above its own',
        'cpp/ops/zz_broken.h: includes "comm/process_group.h", a folder of its own level',
        'cuda/zz_stray/x.cu: its folder is not a level',
      ],
    },
    {
      title: 'test/, scripts/: names a suite outside the folders, a test importing bench/, a script importing a suite and a file too long',
      files: {
        'test/zz-stray.test.js': "// at test/'s top, for the test\n",
        'test/helpers/zz-bench.js': "// imports the benchmarks, for the test\nimport { ROOT } from '../../bench/common.js';\nexport const x = ROOT;\n",
        'scripts/zz-script.js': `// imports a suite and is too long, for the test\nimport '../test/cli/cli.test.js';\n${'\n'.repeat(460)}`,
      },
      named: [
        'test/zz-stray.test.js: a suite belongs in test/<folder>/ for what it tests',
        "test/helpers/zz-bench.js: imports '../../bench/common.js' (bench/common.js): test/ may not depend on the benchmarks",
        "scripts/zz-script.js: imports '../test/cli/cli.test.js' (test/cli/cli.test.js): scripts may use test/helpers/ only",
        /scripts\/zz-script\.js: 46\d lines, more than 450/,
      ],
    },
  ];
  for (const c of cases)
    it(c.title, function () {
      const r = runWithPlanted(c.files);
      expect(r.status).to.equal(1);
      for (const what of c.named) {
        if (typeof what === 'string') expect(r.stderr).to.include(what);
        else expect(r.stderr).to.match(what);
      }
    });
});
