// bench/reproduce.js end to end in its smoke mode (a sliver of Fashion-MNIST, 3 epochs, 4 worker
// processes): its runs, the bit-for-bit check of Accordion with equal levels, and the report with its
// paired differences and chart. The figures of this mode mean nothing; the commands must work.
import { expect } from 'chai';
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { FASHION_MNIST, requireChromium, requireFashionMnist } from '../helpers/outside.js';

const SCRIPT = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', '..', 'bench', 'reproduce.js');

describe('the reproduction of the paper (bench/reproduce.js --quick)', function () {
  this.timeout(600000);
  let tmp;
  const reproduce = (...args) => spawnSync(process.execPath, [SCRIPT, ...args, 'resnet18-powersgd', '--quick', '--seeds', '1', '--dir', path.join(tmp, 'runs'), '--results', tmp], { encoding: 'utf8' });
  before(() => {
    requireFashionMnist();
    requireChromium();
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'acc-reproduce-'));
  });
  after(() => fs.rmSync(tmp, { recursive: true, force: true }));

  it('trains, resumes nothing twice, checks equal levels bit for bit, and reports', () => {
    const run = reproduce('run', '--configs', 'low,high,accordion');
    expect(run.status, run.stdout + run.stderr).to.equal(0);
    expect(run.stdout.match(/trained in/g)).to.have.length(3);
    const again = reproduce('run', '--configs', 'low,high,accordion');
    expect(again.stdout.match(/: kept/g)).to.have.length(3);

    const check = reproduce('check');
    expect(check.status, check.stdout + check.stderr).to.equal(0);
    expect(check.stdout).to.match(/(\d+) of \1 tensors of the last checkpoints .* equal bit for bit; every epoch's test accuracy equal/);

    const report = reproduce('report');
    expect(report.status, report.stderr).to.equal(0);
    const md = fs.readFileSync(path.join(tmp, 'reproduce-resnet18-powersgd-quick.md'), 'utf8');
    for (const row of ['static low (--compressor powersgd --rank 2)', 'static high (--compressor powersgd --rank 1)', 'Accordion (--compressor powersgd --low-rank 2 --high-rank 1)', 'Accordion − static low'])
      expect(md).to.include(row);
    expect(md).to.match(/\*\*Separation\*\*/);
    expect(fs.statSync(path.join(tmp, 'reproduce-resnet18-powersgd-quick.png')).size).to.be.above(10000);
  });

  it("writes the setting's data as it reads it: its first training images and its first test images", async () => {
    const { loadImageDataset } = await import('../../lib/index.js');
    const { firstImages } = await import('../../lib/data/datasets.js');
    const to = path.join(tmp, 'data');
    const r = reproduce('data', '--to', to);
    expect(r.status, r.stderr).to.equal(0);
    const [sliced, whole] = [loadImageDataset('fashion-mnist', to), firstImages(loadImageDataset('fashion-mnist', FASHION_MNIST), { train: 512, test: 1000 })];
    for (const split of ['train', 'test'])
      for (const key of ['images', 'labels']) {
        expect(sliced[split].count, split).to.equal(whole[split].count);
        const bytes = (a) => Buffer.from(a.buffer, a.byteOffset, a.byteLength);
        expect(bytes(sliced[split][key]).equals(bytes(whole[split][key])), `${split} ${key}`).to.equal(true);
      }
    expect([sliced.train.count, sliced.test.count]).to.deep.equal([512, 1000]);
  });

  it('refuses an unknown setting or config, naming it', () => {
    const setting = spawnSync(process.execPath, [SCRIPT, 'run', 'alexnet'], { encoding: 'utf8' });
    expect(setting.status).to.equal(1);
    expect(setting.stderr).to.include("unknown setting 'alexnet' (known: resnet18-powersgd, vgg19bn-powersgd, resnet18-topk, lstm-topk, lstm-topk-1, resnet18-precision, resnet18-batch)");
    const config = reproduce('run', '--configs', 'low,medium');
    expect(config.stderr).to.include("--configs: unknown config 'medium' for resnet18-powersgd (known: low, high, accordion, equal, auto)");
  });
});
