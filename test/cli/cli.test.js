import { expect } from 'chai';
import { spawn, spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { CLI, ROOT } from '../helpers/paths.js';

function run(args, env = {}, timeout = 120000) {
  const r = spawnSync(process.execPath, [CLI, ...args], { encoding: 'utf8', timeout, env: { ...process.env, OMP_NUM_THREADS: '2', ...env } });
  return { code: r.status, signal: r.signal, stdout: r.stdout, stderr: r.stderr };
}

describe('command line', function () {
  let tmp;
  before(() => (tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'acc-cli-'))));
  after(() => fs.rmSync(tmp, { recursive: true, force: true }));

  const usageCases = [
    [['train', '--model', 'resnet18', '--bogus'], /unknown option --bogus/],
    [['train', '--model', 'resnet18', '--epochs', 'three'], /option --epochs: expected an integer, got 'three'/],
    [['train', '--model', 'resnet18', '--lr', 'NaN'], /option --lr: expected a number/],
    [['train', '--model', 'resnet18', '--epochs'], /option --epochs needs a value/],
    [['train', '--model', 'alexnet'], /option --model: expected one of resnet18, vgg19bn/],
    [['train', '--epochs', '1'], /option --model is required/],
    [['train', '--model', 'resnet18', '--milestones', '1,x'], /option --milestones/],
    [['train', '--model', 'resnet18', '--epochs', '0'], /option --epochs: expected a positive integer, got 0/],
    [['train', '--model', 'resnet18', '--quiet=yes'], /option --quiet takes no value/],
    [['frobnicate'], /unknown command 'frobnicate'/],
    [['report', '--bogus', 'runs/a'], /unknown report option --bogus/],
    [['report'], /no run directory given/],
    [['info', '--bogus'], /unknown info option --bogus/],
    // Bounds, refused before any data is read or any memory allocated.
    [['train', '--model', 'resnet18', '--timeout', '2147483648'], /option --timeout: expected an integer from 1 to 2147483647, got 2147483648/],
    [['train', '--model', 'resnet18', '--timeout', '99999999999999999999'], /option --timeout: expected an integer of at most/],
    [['train', '--model', 'resnet18', '--threads', '0'], /option --threads: expected an integer from 1/],
    [['train', '--model', 'resnet18', '--threads', '-3'], /option --threads: expected an integer from 1/],
    [['train', '--model', 'resnet18', '--bucket-mb', '-1'], /option --bucket-mb: expected a number ≥ 0/],
    [['train', '--model', 'resnet18', '--synthetic-train', '9000000000000'], /option --synthetic-train: .*2 × images × 3,073 bytes.*memory/],
    [['train', '--model', 'resnet18', '--batch-size', '1000000000'], /option --batch-size: a batch of 1000000000 needs at least .* GiB.*memory/],
    [['train', '--model', 'vgg19bn', '--eval-batch-size', '1000000000'], /option --eval-batch-size: .*memory/],
    [['train', '--model', 'lstm', '--data', '/nonexistent', '--hidden', '1000000'], /option --hidden: 1000000 with 2 layers.*memory/],
    [['train', '--model', 'lstm', '--data', '/nonexistent', '--hidden', '10000000'], /option --hidden: expected an integer from 1 to 1048576, got 10000000/],
    [['launch', '--master-port', '70000', '--', '--model', 'resnet18'], /option --master-port: expected an integer from 1 to 65535, got 70000/],
    [['launch', '--master-port', '0', '--', '--model', 'resnet18'], /option --master-port: expected an integer from 1 to 65535, got 0/],
  ];
  for (const [args, message] of usageCases) {
    it(`exits 2 naming the problem: ${args.join(' ')}`, function () {
      const r = run(args, {}, 30000);
      expect(r.code, r.stderr).to.equal(2);
      expect(r.stderr).to.match(message);
    });
  }

  it('every command answers --help with its usage, exit 0', function () {
    for (const command of ['train', 'launch', 'cluster', 'report', 'plan', 'info']) {
      const r = run([command, '--help'], {}, 30000);
      expect(r.code, `${command}: ${r.stderr}`).to.equal(0);
      expect(r.stdout, command).to.match(new RegExp(`^Usage: accordion ${command}\\b`));
    }
    const top = run(['--help'], {}, 30000);
    expect(top.code).to.equal(0);
    expect(top.stdout).to.include('Every command takes --help');
  });

  it('lists every option with its default in --help', function () {
    const r = run(['train', '--help']);
    expect(r.code).to.equal(0);
    for (const flag of ['--model', '--epochs', '--batch-size', '--lr', '--data', '--resume', '--compressor', '--seed'])
      expect(r.stdout).to.include(flag);
    expect(r.stdout).to.match(/--epochs N\s+epochs to train \(default: 300; 6 on synthetic data, 90 for lstm\)/);
  });

  it('reports a missing data directory clearly (exit 1)', function () {
    const r = run(['train', '--model', 'resnet18', '--data', path.join(tmp, 'nope'), '--out', path.join(tmp, 'run')]);
    expect(r.code).to.equal(1);
    expect(r.stderr).to.match(/data directory not found: .*nope/);
  });

  it('reports a corrupt CIFAR file with its name and offset (exit 1)', function () {
    const dir = path.join(tmp, 'corrupt');
    fs.mkdirSync(dir);
    fs.writeFileSync(path.join(dir, 'data_batch_1.bin'), Buffer.alloc(3073 * 2 + 100));
    fs.writeFileSync(path.join(dir, 'test_batch.bin'), Buffer.alloc(3073));
    const r = run(['train', '--model', 'resnet18', '--data', dir, '--out', path.join(tmp, 'run2')]);
    expect(r.code).to.equal(1);
    expect(r.stderr).to.include('data_batch_1.bin');
    expect(r.stderr).to.match(/6146/);
  });

  it('reports a label out of range with its record (exit 1)', function () {
    const dir = path.join(tmp, 'badlabel');
    fs.mkdirSync(dir);
    const train = Buffer.alloc(3073 * 3);
    train[3073] = 12;
    fs.writeFileSync(path.join(dir, 'data_batch_1.bin'), train);
    fs.writeFileSync(path.join(dir, 'test_batch.bin'), Buffer.alloc(3073));
    const r = run(['train', '--model', 'resnet18', '--data', dir, '--out', path.join(tmp, 'run3')]);
    expect(r.code).to.equal(1);
    expect(r.stderr).to.match(/record 1 has label 12/);
  });

  it('refuses to write synthetic data over a directory of real CIFAR files (exit 2), leaving them as they were', function () {
    const dir = path.join(tmp, 'real-cifar');
    fs.mkdirSync(dir);
    const names = ['data_batch_1.bin', 'data_batch_2.bin', 'data_batch_3.bin', 'data_batch_4.bin', 'data_batch_5.bin', 'test_batch.bin'];
    names.forEach((n, i) => fs.writeFileSync(path.join(dir, n), Buffer.alloc(3073 * 2, i + 1)));
    const r = run(['train', '--model', 'resnet18', '--dataset', 'synthetic', '--data', dir, '--epochs', '1', '--out', path.join(tmp, 'run-real')], {}, 60000);
    expect(r.code, r.stderr).to.equal(2);
    expect(r.stderr).to.include(dir);
    expect(r.stderr).to.match(/refusing to write synthetic data/);
    expect(fs.readdirSync(dir).sort()).to.deep.equal([...names].sort());
    names.forEach((n, i) => expect(fs.readFileSync(path.join(dir, n)).equals(Buffer.alloc(3073 * 2, i + 1)), n).to.equal(true));
  });

  it('names an empty wiki.test.tokens (exit 1)', function () {
    const dir = path.join(tmp, 'wikitext-empty-test');
    fs.mkdirSync(dir);
    const words = 'a b c d e f g h i j k l m n o p\n'.repeat(50);
    fs.writeFileSync(path.join(dir, 'wiki.train.tokens'), words);
    fs.writeFileSync(path.join(dir, 'wiki.valid.tokens'), words);
    fs.writeFileSync(path.join(dir, 'wiki.test.tokens'), '');
    const r = run(['train', '--model', 'lstm', '--data', dir, '--hidden', '8', '--epochs', '1', '--out', path.join(tmp, 'run-wt')], {}, 60000);
    expect(r.code, r.stderr).to.equal(1);
    expect(r.stderr).to.include(path.join(dir, 'wiki.test.tokens'));
    expect(r.stderr).to.match(/empty/);
  });

  /**
   * Starts a long run on a tiny synthetic set, waits for its first checkpoint, sends `signal` and
   * collects the exit. Bounded: 90 s to the checkpoint, 60 s from the signal to the exit.
   */
  async function interruptedRun(signal, name) {
    const out = path.join(tmp, name);
    const args = ['train', '--model', 'resnet18', '--dataset', 'synthetic', '--data', path.join(tmp, `${name}-data`), '--synthetic-train', '20',
      '--synthetic-test', '10', '--batch-size', '4', '--eval-batch-size', '10', '--epochs', '1000', '--quiet', '--out', out];
    const child = spawn(process.execPath, [CLI, ...args], { env: { ...process.env, OMP_NUM_THREADS: '2' } });
    let stdout = '', stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    const exited = new Promise((resolve) => child.on('exit', (code, sig) => resolve({ code, signal: sig })));
    const deadline = (ms, what) => new Promise((_, reject) => setTimeout(() => reject(new Error(`${what} after ${ms} ms; stderr: ${stderr}`)), ms).unref());
    try {
      const latest = path.join(out, 'checkpoints', 'latest');
      await Promise.race([
        (async () => {
          while (!fs.existsSync(latest)) {
            if (child.exitCode !== null) throw new Error(`the run ended early: ${stderr}`);
            await new Promise((r) => setTimeout(r, 200));
          }
        })(),
        deadline(90000, 'no checkpoint'),
      ]);
      child.kill(signal);
      const result = await Promise.race([exited, deadline(60000, `no exit after ${signal}`)]);
      return { ...result, stdout, stderr, out };
    } finally {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    }
  }

  for (const [signal, code] of [['SIGINT', 130], ['SIGTERM', 143]]) {
    it(`a run stopped by ${signal} exits ${code}, saying so and how to resume from its last checkpoint`, async function () {
      this.timeout(180000);
      const r = await interruptedRun(signal, `run-${signal}`);
      expect(r.code, r.stderr).to.equal(code);
      expect(r.stderr).to.match(new RegExp(`interrupted by ${signal}; this run did not finish \\(\\d+ of 1000 epochs completed\\)`));
      const latest = fs.readFileSync(path.join(r.out, 'checkpoints', 'latest'), 'utf8').trim();
      expect(r.stderr).to.include(`the last checkpoint is ${path.join(r.out, 'checkpoints', latest)}`);
      expect(r.stderr).to.include(`resume with:\n  accordion train --resume ${r.out}\n`);
      expect(r.stdout).to.not.match(/final test accuracy/);
      const summary = JSON.parse(fs.readFileSync(path.join(r.out, 'summary.json'), 'utf8'));
      expect(summary.interrupted).to.equal(true);
      const events = fs.readFileSync(path.join(r.out, 'metrics.jsonl'), 'utf8').trimEnd().split('\n').map((l) => JSON.parse(l).event);
      expect(events[events.length - 1]).to.equal('interrupted');
    });
  }

  it('prints build and device information without a GPU', function () {
    const r = run(['info']);
    expect(r.code).to.equal(0);
    const info = JSON.parse(r.stdout);
    expect(info.build.dnnl).to.match(/^\d+\.\d+/);
    expect(info.devices.count).to.be.a('number');
    // OMP_NUM_THREADS=2 (run's default): an overlapped exchange takes one of the two threads.
    expect(info.threads.total).to.equal(2);
    expect(info.threads.overlapped).to.deep.equal({ compute: 1, communication: 1 });
    expect(info.threads.alone).to.deep.equal({ compute: 2, communication: 0 });
  });

  it('info names where the addon and its libraries were loaded from, as ldd resolves them, and the CPU features lscpu lists', function () {
    const info = JSON.parse(run(['info']).stdout);
    const addon = path.join(ROOT, 'build', 'Release', 'accordion.node');
    expect(info.loaded.addon).to.deep.equal({ kind: 'build', dir: ROOT, file: addon });
    // Each library the addon links, resolved by ldd, is mapped from the file ldd names.
    const linked = spawnSync('ldd', [addon], { encoding: 'utf8' }).stdout.matchAll(/^\s*(lib(?:dnnl|openblas|gloo)\S*) => (\S+)/gm);
    const mapped = Object.values(info.loaded.libraries);
    for (const [, soname, file] of linked) expect(mapped, soname).to.include(fs.realpathSync(file));
    const flags = spawnSync('lscpu', [], { encoding: 'utf8' }).stdout.match(/^Flags:\s*(.*)$/m)[1].split(/\s+/);
    for (const feature of ['avx2', 'avx512f', 'avx512_bf16', 'amx_bf16', 'amx_tile']) expect(info.cpu[feature], feature).to.equal(flags.includes(feature));
  });
});
