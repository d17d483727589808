// The layering (docs/architecture.md), checked by scripts/check-layers.js over the TypeScript's imports
// and the native code's includes; and the check itself, on files that break each rule.
import { expect } from 'chai';
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = path.join(path.dirname(fileURLToPath(import.meta.url)), '..');
const SCRIPT = path.join(ROOT, 'scripts', 'check-layers.js');
const run = () => spawnSync(process.execPath, [SCRIPT], { encoding: 'utf8' });

describe('TypeScript layers', function () {
  it('every import in ts/ points down the layers, with no cycle, and every file opens with its concern', function () {
    const r = run();
    expect(r.status, r.stderr).to.equal(0);
  });

  it('names a file that imports upward, an import cycle and a file without its opening comment', function () {
    // Two files in base/ (the lowest layer) that break the rules, removed afterwards.
    const up = path.join(ROOT, 'ts', 'base', 'zz-upward.ts');
    const back = path.join(ROOT, 'ts', 'base', 'zz-back.ts');
    try {
      fs.writeFileSync(up, "/** breaks the layering, for the test */\nimport { Trainer } from '../train/trainer.js';\nimport { x } from './zz-back.js';\nexport const y = [Trainer, x];\n");
      fs.writeFileSync(back, "import { y } from './zz-upward.js';\nexport const x = y;\n");
      const r = run();
      expect(r.status).to.equal(1);
      expect(r.stderr).to.include("base/zz-upward.ts: imports '../train/trainer.js' (train/trainer.ts), a layer above its own");
      expect(r.stderr).to.match(/import cycle: base\/zz-(upward|back)\.ts → base\/zz-(upward|back)\.ts → /);
      expect(r.stderr).to.include('base/zz-back.ts: does not open with a comment naming its concern');
    } finally {
      fs.rmSync(up, { force: true });
      fs.rmSync(back, { force: true });
    }
  });
});

describe('native layers', function () {
  it('every include in cpp/ and cuda/ points down the levels (core → lib → comm | ops | data → compress → models → train → napi | lab)', function () {
    const r = run();
    expect(r.status, r.stderr).to.equal(0);
    expect(r.stdout).to.include('cpp/, cuda/: core → lib → comm | ops | data → compress → models → train → napi | lab: every include points down');
  });

  it('names a file that includes a level above its own, one that includes a folder of its own level, and a folder that is no level', function () {
    // Files that break the rules, removed afterwards: ops/ including compress/ (above) and comm/ (its level).
    const broken = path.join(ROOT, 'cpp', 'ops', 'zz_broken.h');
    const stray = path.join(ROOT, 'cuda', 'zz_stray', 'x.cu');
    try {
      fs.writeFileSync(broken, '// breaks the levels, for the test\n#pragma once\n#include "compress/reducer.h"\n#include "comm/process_group.h"\n#include <vector>\n');
      fs.mkdirSync(path.dirname(stray), { recursive: true });
      fs.writeFileSync(stray, '// in a folder that is no level\n#include "core/tensor.h"\n');
      const r = run();
      expect(r.status).to.equal(1);
      expect(r.stderr).to.include('cpp/ops/zz_broken.h: includes "compress/reducer.h", a level above its own');
      expect(r.stderr).to.include('cpp/ops/zz_broken.h: includes "comm/process_group.h", a folder of its own level');
      expect(r.stderr).to.include('cuda/zz_stray/x.cu: its folder is not a level');
    } finally {
      fs.rmSync(broken, { force: true });
      fs.rmSync(path.dirname(stray), { recursive: true, force: true });
    }
  });
});
