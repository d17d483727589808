// The dense setting of bench/reproduce.js on one worker beside PyTorch (Debian's python3-torch), the
// outside reference of the engine's training on real images:
//   1. from the same initial weights and the same 10 batches (the engine's batcher, written out),
//      the engine's training losses beside PyTorch's in fp32 and in fp64 (test/oracles/torch_ddp_steps.py),
//      per seed: where each pair first parts by more than 1e-3, and how far the engine is from fp64
//      against how far PyTorch's fp32 is;
//   2. full runs over the seeds, the engine (`accordion train`) and PyTorch (test/oracles/torch_train.py)
//      with the same recipe, their mean final test accuracies within 0.5 points (Welch's 95% interval
//      of the difference reported).
// Writes bench/results/reproduce-SETTING-peer.md.
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { PYTHON, ROOT, fmt, freePort, meanInterval, peerEnv, runLogged, t95, ORACLES } from './common.js';
import { finished } from './reproduce.js';
import { WORKERS, scheduleArgs } from './reproduce-settings.js';

const STEPS = 10;
const THREADS = 2;

/** The dense one-worker recipe of a setting: its global batch on one worker at the same peak rate. */
function recipe(s) {
  const batch = s.batchSize * WORKERS;
  const schedule = scheduleArgs(s);
  const milestones = schedule[schedule.indexOf('--milestones') + 1];
  return { batch, lr: (0.1 * batch) / 128, milestones };
}

/** 1: the first STEPS losses from the same weights and batches, at the rate `lr`. */
async function firstLosses(s, o, tmp, seed, lr) {
  const { Batcher, Model, loadImageDataset, writeSafetensors, readSafetensors } = await import('../lib/index.js');
  const { firstImages } = await import('../lib/data/datasets.js');
  const { batch } = recipe(s);
  const data = firstImages(loadImageDataset('fashion-mnist', o.data, {}), { train: s.trainImages });
  // VGG's dropout draws differ between the two: off on both sides for this comparison.
  const model = await Model.create({ architecture: s.model, width: s.width, classes: 10, seed, learningRate: lr, threads: THREADS, dropout: 0 });
  const initial = path.join(tmp, 'initial.safetensors');
  await model.save(initial);
  const batcher = new Batcher(data.train, { batchSize: batch, mean: data.mean, std: data.std, seed, shuffle: true, augment: true });
  let epoch = 0;
  batcher.startEpoch(epoch);
  const tensors = [];
  const ours = [];
  for (let step = 0; step < STEPS; step++) {
    let b = await batcher.next();
    if (b === null) {
      batcher.startEpoch(++epoch);
      b = await batcher.next();
    }
    tensors.push({ name: `step${step}.rank0.images`, dtype: 'F32', shape: [b.labels.length, 3, 32, 32], data: new Uint8Array(b.images.buffer, b.images.byteOffset, b.images.byteLength) });
    tensors.push({ name: `step${step}.rank0.labels`, dtype: 'I32', shape: [b.labels.length], data: new Uint8Array(b.labels.buffer, b.labels.byteOffset, b.labels.byteLength) });
    ours.push((await model.trainStep({ images: b.images, labels: b.labels })).loss);
  }
  await model.dispose();
  const batches = path.join(tmp, 'batches.safetensors');
  writeSafetensors(batches, tensors);
  /** PyTorch's losses of the same steps, computed in `dtype`. */
  const torchLosses = async (dtype) => {
    const out = path.join(tmp, `torch-steps-${dtype}.safetensors`);
    const port = await freePort();
    const args = [path.join(ORACLES, 'torch_ddp_steps.py'), '--rank', '0', '--world', '1', '--master', `127.0.0.1:${port}`, '--model', s.model,
      '--width', String(s.width), '--state', initial, '--batches', batches, '--steps', String(STEPS), '--lr', String(lr), '--dtype', dtype, '--out', out];
    const { code } = await runLogged(PYTHON, args, `${out}.log`, { spawn: { env: peerEnv(1) } });
    if (code !== 0) throw new Error(`torch_ddp_steps.py failed: ${fs.readFileSync(`${out}.log`, 'utf8')}`);
    const theirs = readSafetensors(out).tensors;
    return ours.map((_, step) => new Float64Array(theirs.get(`step${step}.loss`).data.slice().buffer)[0]);
  };
  const [fp32, fp64] = [await torchLosses('float32'), await torchLosses('float64')];
  const rel = (a, b) => Math.abs(a - b) / Math.abs(b);
  return ours.map((loss, step) => ({ step, ours: loss, theirs: fp32[step], exact: fp64[step], relative: rel(loss, fp32[step]), oursExact: rel(loss, fp64[step]), theirsExact: rel(fp32[step], fp64[step]) }));
}

/** 2: the engine's full dense runs over the seeds, one worker. */
async function engineRun(s, o, seed) {
  const { batch, lr, milestones } = recipe(s);
  const run = path.join(o.dir, s.name, s.tag, `peer-engine-seed${seed}`);
  if (!finished(run)) {
    const resumable = fs.existsSync(path.join(run, 'checkpoints', 'latest'));
    const args = [path.join(ROOT, 'lib', 'cli.js'), 'train', '--model', s.model, '--width', String(s.width), '--dataset', 'fashion-mnist', '--data', o.data,
      '--train-images', String(s.trainImages), '--epochs', String(s.epochs), '--batch-size', String(batch), '--lr', String(lr), '--warmup-epochs', '5',
      '--milestones', milestones, '--seed', String(seed), '--threads', String(THREADS), '--quiet', '--out', run, ...(resumable ? ['--resume', run] : ['--overwrite'])];
    fs.mkdirSync(path.dirname(run), { recursive: true });
    const { code } = await runLogged(process.execPath, args, `${run}.log`, { spawn: { env: { ...process.env, OMP_NUM_THREADS: String(THREADS) } } });
    if (code !== 0) throw new Error(`the engine's dense run, seed ${seed}, failed: see ${run}.log`);
  }
  const epochs = fs.readFileSync(path.join(run, 'metrics.jsonl'), 'utf8').split('\n').filter((l) => l.includes('"event":"epoch"')).map((l) => JSON.parse(l));
  return { accuracy: 100 * epochs.at(-1).testAccuracy, minutes: epochs.reduce((a, e) => a + e.seconds, 0) / 60 };
}

/** 2: PyTorch's full dense run of one seed (its JSON lines kept in a file; a finished one is reused). */
async function torchRun(s, o, seed) {
  const { batch, lr, milestones } = recipe(s);
  const file = path.join(o.dir, s.name, s.tag, `peer-torch-seed${seed}.jsonl`);
  const done = () => fs.existsSync(file) && fs.readFileSync(file, 'utf8').split('\n').filter(Boolean).length === s.epochs;
  if (!done()) {
    const port = await freePort();
    const args = [path.join(ORACLES, 'torch_train.py'), '--rank', '0', '--world', '1', '--master', `127.0.0.1:${port}`, '--model', s.model,
      '--width', String(s.width), '--dataset', 'fashion-mnist', '--data', o.data, '--train-images', String(s.trainImages), '--epochs', String(s.epochs),
      '--batch', String(batch), '--lr', String(lr), '--warmup-epochs', '5', '--milestones', milestones, '--seed', String(seed)];
    const { code, out } = await runLogged(PYTHON, args, `${file}.log`, { stdout: 'pipe', spawn: { env: peerEnv(THREADS) } });
    if (code !== 0) throw new Error(`torch_train.py, seed ${seed}, failed: see ${file}.log`);
    fs.writeFileSync(file, out);
  }
  const epochs = fs.readFileSync(file, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));
  return { accuracy: 100 * epochs.at(-1).testAccuracy, minutes: epochs.reduce((a, e) => a + e.seconds, 0) / 60 };
}

/** Welch's 95% interval of mean(a) − mean(b) (t quantile at the Welch–Satterthwaite degrees of freedom, rounded down). */
function welch(a, b) {
  const [ma, mb] = [meanInterval(a), meanInterval(b)];
  const [va, vb] = [ma.sd ** 2 / a.length, mb.sd ** 2 / b.length];
  const df = Math.max(1, Math.floor((va + vb) ** 2 / (va ** 2 / (a.length - 1) + vb ** 2 / (b.length - 1))));
  const diff = ma.mean - mb.mean;
  const half = t95(df) * Math.sqrt(va + vb);
  return { diff, low: diff - half, high: diff + half, df };
}

export async function runPeerComparison(s, o) {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'accordion-reproduce-peer-'));
  const lines = [];
  const say = (...l) => {
    lines.push(...l);
    console.log(l.join('\n'));
  };
  try {
    const { batch, lr, milestones } = recipe(s);
    say(`# ${s.name}: the dense setting on one worker beside PyTorch${s.quick ? ' (quick mode: not to be quoted)' : ''}`, '',
      `Written by \`node bench/reproduce.js peer ${s.name}${s.quick ? ' --quick' : ''}\` on ${new Date().toISOString().slice(0, 10)} (${os.cpus()[0]?.model}, ` +
      `${THREADS} threads each). ${s.model} width ${s.width}, the first ${s.trainImages} Fashion-MNIST training images, batch ${batch} on one worker, lr ${lr}, ` +
      `milestones ${milestones}, ${s.epochs} epochs; PyTorch ${PYTHON} (Debian's python3-torch).`, '');
    // Training from a fresh initialisation at the setting's rate is chaotic: rounding differences grow
    // about tenfold a step. PyTorch in float64 is the reference both fp32 implementations are held to.
    const bySeed = [];
    for (const seed of o.seeds) bySeed.push(await firstLosses(s, o, tmp, seed, lr));
    const firstBeyond = (runs, key) => runs.map((ls) => ls.find((l) => l[key] > 1e-3)?.step + 1 || 'none');
    const logRatios = bySeed.flatMap((ls) => ls.slice(1).map((l) => Math.log(l.oursExact / l.theirsExact)));
    const ratio = Math.exp(logRatios.reduce((a, b) => a + b, 0) / logRatios.length);
    // The same at smaller rates, where rounding differences should stay small if the arithmetic agrees.
    const calmer = [];
    for (const rate of [lr / 10, lr / 100]) {
      const runs = [];
      for (const seed of o.seeds) runs.push(await firstLosses(s, o, tmp, seed, rate));
      const largest = (key) => Math.max(...runs.flatMap((ls) => ls.map((l) => l[key])));
      calmer.push(`| ${rate} | ${firstBeyond(runs, 'relative').join(', ')} | ${firstBeyond(runs, 'theirsExact').join(', ')} | ${largest('relative').toExponential(2)} | ${largest('oursExact').toExponential(2)} | ${largest('theirsExact').toExponential(2)} |`);
    }
    say(`## The first ${STEPS} training losses from the same weights and batches (dropout off on both sides)`, '',
      `Seed ${o.seeds[0]}; relative differences:`, '',
      '| step | engine | PyTorch fp32 | PyTorch fp64 | engine − fp32 | engine − fp64 | fp32 − fp64 |', '| ---: | ---: | ---: | ---: | ---: | ---: | ---: |',
      ...bySeed[0].map((l) => `| ${l.step + 1} | ${l.ours.toFixed(6)} | ${l.theirs.toFixed(6)} | ${l.exact.toFixed(6)} | ${l.relative.toExponential(2)} | ${l.oursExact.toExponential(2)} | ${l.theirsExact.toExponential(2)} |`), '',
      `Over seeds ${o.seeds.join(', ')}: the first step beyond 1e-3 relative is, engine against PyTorch fp32, ${firstBeyond(bySeed, 'relative').join(', ')}; ` +
        `PyTorch fp32 against its own fp64, ${firstBeyond(bySeed, 'theirsExact').join(', ')}. The engine's distance to fp64 over PyTorch fp32's (steps 2–${STEPS}, ` +
        `geometric mean over the seeds): ${fmt(ratio, 2)}.`, '',
      `At smaller rates (seeds ${o.seeds.join(', ')}; the largest relative difference over the ${STEPS} steps and the seeds):`, '',
      '| lr | first step beyond 1e-3, engine − fp32 | first step beyond 1e-3, fp32 − fp64 | largest engine − fp32 | largest engine − fp64 | largest fp32 − fp64 |',
      '| ---: | ---: | ---: | ---: | ---: | ---: |', ...calmer, '');
    const engine = [];
    const torch = [];
    for (const seed of o.seeds) {
      engine.push(await engineRun(s, o, seed));
      torch.push(await torchRun(s, o, seed));
      console.log(`  seed ${seed}: engine ${fmt(engine.at(-1).accuracy, 2)}%, PyTorch ${fmt(torch.at(-1).accuracy, 2)}%`);
    }
    const w = welch(engine.map((r) => r.accuracy), torch.map((r) => r.accuracy));
    say('## Full runs', '', `| | ${o.seeds.map((x) => `seed ${x}`).join(' | ')} | mean | minutes / run |`, `| --- | ${o.seeds.map(() => '---:').join(' | ')} | ---: | ---: |`,
      ...[['engine', engine], ['PyTorch', torch]].map(([name, rs]) =>
        `| ${name} | ${rs.map((r) => `${fmt(r.accuracy, 2)}%`).join(' | ')} | ${fmt(meanInterval(rs.map((r) => r.accuracy)).mean, 2)}% | ${fmt(meanInterval(rs.map((r) => r.minutes)).mean, 1)} |`), '',
      `Engine − PyTorch: ${fmt(w.diff, 2)} points (Welch's 95% interval ${fmt(w.low, 2)} … ${fmt(w.high, 2)}, ${w.df} degrees of freedom): the means are ` +
      `${Math.abs(w.diff) <= 0.5 ? 'within' : 'NOT within'} 0.5 points.`, '');
    const file = path.join(o.results, `reproduce-${s.name}${s.quick ? '-quick' : ''}-peer.md`);
    fs.writeFileSync(file, lines.join('\n'));
    console.log(`written to ${path.relative(process.cwd(), file)}`);
    if (Math.abs(w.diff) > 0.5) process.exitCode = 1;
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
}
