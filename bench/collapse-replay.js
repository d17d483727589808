// One epoch of a dense data-parallel run replayed from its checkpoint, the engine beside PyTorch DDP
// in float32 and float64 on the same state and batches: did the engine's arithmetic make what the
// epoch did (a loss that rose, an accuracy that fell), or would any exact implementation of the
// recipe have done the same?
//
//   node bench/collapse-replay.js --run RUN_DIR --from 5 [--out bench/results/dense-collapse-replay.md]
//
// From RUN_DIR/checkpoints/epoch-000<from> (weights, batch-norm statistics, momentum) the engine's
// workers, joined in this process, take epoch <from>+1's steps on the batches each rank's batcher
// gives in that epoch, at that epoch's rate; their final weights are compared with the run's own next
// checkpoint, when kept (the replay is the run, bit for bit, or says by how much it is not). The same
// batches, written out, and the same state go to test/oracles/torch_ddp_steps.py (one process per rank,
// Gloo, broadcast_buffers on), once in float32 and once in float64. Each side's final weights are
// scored by test/oracles/torch_recomputed_loss.py (PyTorch, saved statistics) on the run's test set.
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { parseArgs } from 'node:util';
import { PYTHON, ROOT, fmt, freePort, peerEnv, runLogged, runMain, ORACLES } from './common.js';

const USAGE = 'usage: node bench/collapse-replay.js --run RUN_DIR --from EPOCH [--out FILE.md]';

const f64 = (t) => new Float64Array(t.data.buffer.slice(t.data.byteOffset, t.data.byteOffset + t.data.byteLength));
const f32 = (t) => new Float32Array(t.data.buffer.slice(t.data.byteOffset, t.data.byteOffset + t.data.byteLength));
const bytes = (a) => new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
const mean = (xs) => xs.reduce((a, b) => a + b, 0) / xs.length;

function options() {
  const { values } = parseArgs({ options: { run: { type: 'string' }, from: { type: 'string' }, out: { type: 'string' } } });
  if (!values.run || values.from === undefined) throw new Error(USAGE);
  const from = Number(values.from);
  if (!Number.isInteger(from) || from < 1) throw new Error(`--from must be an epoch ≥ 1 whose checkpoint the run kept, got ${values.from}`);
  const config = JSON.parse(fs.readFileSync(path.join(values.run, 'config.json'), 'utf8'));
  if (config.compressor !== 'none' || config.dataset === 'wikitext2' || config.precision !== 'fp32' || config.device !== 'cpu')
    throw new Error(`${values.run}: the replay takes dense fp32 image runs on the CPU (this one: --compressor ${config.compressor}, --dataset ${config.dataset}, --precision ${config.precision}, --device ${config.device})`);
  const checkpoint = (e) => path.join(values.run, 'checkpoints', `epoch-${String(e).padStart(4, '0')}`);
  if (!fs.existsSync(checkpoint(from))) throw new Error(`${checkpoint(from)} does not exist: the run kept no checkpoint of epoch ${from}`);
  const next = fs.existsSync(checkpoint(from + 1)) ? checkpoint(from + 1) : undefined;
  return { run: values.run, from, config, start: checkpoint(from), next, out: values.out };
}

/** The engine's workers in this process take epoch `from`+1 from the checkpoint; its batches, per-step losses and final state. */
async function engineEpoch(o, tmp) {
  const { Batcher, Model, ProcessGroup, learningRateForEpoch, loadCheckpoint, loadImageDataset, setThreads, writeSafetensors } = await import('../lib/index.js');
  const { firstImages } = await import('../lib/data/datasets.js');
  const c = o.config;
  const W = c.workers;
  const loaded = loadImageDataset(c.dataset, c.dataDir, { train: c.syntheticTrain, test: c.syntheticTest, seed: c.seed });
  const data = firstImages(loaded, { train: c.trainImages, test: c.testImages });
  const lr = learningRateForEpoch(o.from, { base: c.lr, workers: W, warmupEpochs: c.warmupEpochs, milestones: c.milestones, decay: c.lrDecay });
  // The process's threads as `accordion train --threads 1` sets them: OpenBLAS's count is the
  // process's, not a model's, and another count rounds its products differently.
  setThreads(1);
  const port = await freePort();
  const groups = await Promise.all(Array.from({ length: W }, (_, rank) => ProcessGroup.connect({ rank, worldSize: W, masterPort: port, hostStore: rank === 0 })));
  const models = await Promise.all(
    groups.map((group) =>
      Model.create({
        architecture: c.model, classes: data.classes, width: c.width, seed: c.seed, learningRate: lr, momentum: c.momentum, weightDecay: c.weightDecay,
        nesterov: c.nesterov, compressor: 'none', group, bucketMb: c.bucketMb, broadcastBuffers: c.broadcastBuffers, threads: 1,
      }),
    ),
  );
  try {
    await Promise.all(models.map((m, r) => {
      const saved = loadCheckpoint(o.start, r, W);
      return m.loadStateDict([...saved.model, ...saved.trainer]);
    }));
    const batchers = groups.map((_, rank) =>
      new Batcher(data.train, { mean: data.mean, std: data.std, seed: c.seed, rank, worldSize: W, device: 'cpu', batchSize: c.batchSize, shuffle: true, augment: true }),
    );
    batchers.forEach((b) => b.startEpoch(o.from));
    const tensors = [];
    const losses = [];
    for (let step = 0; ; step++) {
      const batches = await Promise.all(batchers.map((b) => b.next()));
      if (batches.some((b) => b === null)) break;
      batches.forEach((b, r) => {
        tensors.push({ name: `step${step}.rank${r}.images`, dtype: 'F32', shape: [b.labels.length, 3, 32, 32], data: bytes(b.images) });
        tensors.push({ name: `step${step}.rank${r}.labels`, dtype: 'I32', shape: [b.labels.length], data: bytes(b.labels) });
      });
      const results = await Promise.all(models.map((m, r) => m.trainStep(batches[r])));
      losses.push(results.map((r) => r.loss));
    }
    const batchFile = path.join(tmp, 'batches.safetensors');
    writeSafetensors(batchFile, tensors);
    // As the trainer does before a checkpoint: every rank takes rank 0's buffers.
    await Promise.all(models.map((m) => m.syncReplicas()));
    const final = path.join(tmp, 'engine.safetensors');
    await models[0].save(final);
    return { lr, losses, batchFile, final };
  } finally {
    await Promise.all(models.map((m) => m.dispose()));
    await Promise.all(groups.map((g) => g.dispose()));
  }
}

/** PyTorch DDP from the same checkpoint over the same batches in `dtype`: per-step losses (one row per step, one per rank) and rank 0's final state. */
async function torchEpoch(o, engine, steps, dtype, tmp) {
  const { readSafetensors, writeSafetensors } = await import('../lib/index.js');
  const port = await freePort();
  const W = o.config.workers;
  const outputs = Array.from({ length: W }, (_, r) => path.join(tmp, `torch-${dtype}-rank${r}.safetensors`));
  const runs = outputs.map((out, rank) =>
    runLogged(
      PYTHON,
      [path.join(ORACLES, 'torch_ddp_steps.py'), '--rank', String(rank), '--world', String(W), '--master', `127.0.0.1:${port}`,
        '--model', o.config.model, '--width', String(o.config.width), '--state', path.join(o.start, 'model.safetensors'),
        '--momentum-state', path.join(o.start, 'trainer.safetensors'), '--batches', engine.batchFile, '--steps', String(steps),
        '--lr', String(engine.lr), '--momentum', String(o.config.momentum), '--weight-decay', String(o.config.weightDecay),
        '--dtype', dtype, '--final-state', '--out', out],
      `${out}.log`,
      { spawn: { env: peerEnv(1) } },
    ),
  );
  const codes = await Promise.all(runs);
  codes.forEach(({ code }, r) => {
    if (code !== 0) throw new Error(`torch_ddp_steps.py (${dtype}, rank ${r}) failed: ${fs.readFileSync(`${outputs[r]}.log`, 'utf8')}`);
  });
  const files = outputs.map((f) => readSafetensors(f).tensors);
  const losses = Array.from({ length: steps }, (_, s) => files.map((t) => f64(t.get(`step${s}.loss`))[0]));
  const margins = Array.from({ length: steps }, (_, s) => Math.min(...files.map((t) => f64(t.get(`step${s}.margin`))[0])));
  // Rank 0's state as a model file (float32, the names of the state_dict).
  const final = path.join(tmp, `torch-${dtype}.safetensors`);
  const state = [...files[0].values()].filter((t) => !/^step\d+\./.test(t.name));
  writeSafetensors(final, state.map((t) => (t.dtype === 'F64' ? { name: t.name, dtype: 'F32', shape: t.shape, data: bytes(Float32Array.from(f64(t))) } : t)));
  return { losses, margins, final };
}

/** Test accuracy and loss of model files, scored by PyTorch with their saved statistics. */
async function scores(o, files, tmp) {
  const { defaultCacheDir } = await import('../lib/data/datasets.js');
  const c = o.config;
  const data = c.dataDir ?? path.join(defaultCacheDir(), `synthetic-${c.syntheticTrain}-${c.syntheticTest}-${c.seed}`);
  const args = [path.join(ORACLES, 'torch_recomputed_loss.py'), '--model', c.model, '--width', String(c.width), '--dtype', 'float32', '--data', data,
    ...files.flatMap((f) => ['--checkpoint', f])];
  const log = path.join(tmp, 'scores.log');
  const { code, out } = await runLogged(PYTHON, args, log, { stdout: 'pipe', spawn: { env: peerEnv(2) } });
  if (code !== 0) throw new Error(`torch_recomputed_loss.py failed: ${fs.readFileSync(log, 'utf8')}`);
  return out.split('\n').filter(Boolean).map((l) => JSON.parse(l).scores.saved.test);
}

/** The largest relative distance ‖a − b‖/‖b‖ between same-named F32 entries of two model files, and its entry. */
async function stateDistance(a, b) {
  const { readSafetensors } = await import('../lib/index.js');
  const [x, y] = [readSafetensors(a).tensors, readSafetensors(b).tensors];
  let worst = { relative: 0, name: '' };
  for (const [name, t] of x) {
    if (t.dtype !== 'F32' || !y.has(name)) continue;
    const [u, v] = [f32(t), f32(y.get(name))];
    let diff = 0, size = 0;
    for (let i = 0; i < u.length; i++) {
      diff += (u[i] - v[i]) ** 2;
      size += v[i] ** 2;
    }
    const relative = Math.sqrt(diff / Math.max(size, Number.MIN_VALUE));
    if (relative > worst.relative) worst = { relative, name };
  }
  return worst;
}

/** The run's record of `epoch` in its metrics.jsonl, if it has one. */
function readEpochRecord(run, epoch) {
  const file = path.join(run, 'metrics.jsonl');
  if (!fs.existsSync(file)) return undefined;
  const records = fs.readFileSync(file, 'utf8').split('\n').filter((l) => l.includes('"event":"epoch"')).map((l) => JSON.parse(l));
  return records.find((r) => r.epoch === epoch);
}

async function main() {
  const o = options();
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'accordion-collapse-replay-'));
  try {
    const started = new Date();
    const engine = await engineEpoch(o, tmp);
    const steps = engine.losses.length;
    process.stderr.write(`engine: ${steps} steps at lr ${engine.lr}, mean loss ${fmt(mean(engine.losses.flat()), 4)}\n`);
    const fp32 = await torchEpoch(o, engine, steps, 'float32', tmp);
    process.stderr.write(`PyTorch float32: mean loss ${fmt(mean(fp32.losses.flat()), 4)}\n`);
    const fp64 = await torchEpoch(o, engine, steps, 'float64', tmp);
    process.stderr.write(`PyTorch float64: mean loss ${fmt(mean(fp64.losses.flat()), 4)}\n`);
    const runs = [
      { name: 'engine (replay)', losses: engine.losses, final: engine.final },
      { name: 'PyTorch DDP, float32', losses: fp32.losses, final: fp32.final },
      { name: 'PyTorch DDP, float64', losses: fp64.losses, final: fp64.final },
    ];
    const tested = await scores(o, [...runs.map((r) => r.final), ...(o.next ? [path.join(o.next, 'model.safetensors')] : [])], tmp);
    const lines = [
      `# Epoch ${o.from + 1} of ${o.run} replayed from its epoch-${o.from} checkpoint`,
      '',
      `${started.toISOString()}; \`node bench/collapse-replay.js --run ${o.run} --from ${o.from}\`. ${o.config.model}, ${o.config.workers} workers ` +
        `of batch ${o.config.batchSize}, ${steps} steps at lr ${fmt(engine.lr, 4)} (the epoch's rate), the same state (weights, statistics, momentum) and the same batches on every side.`,
      '',
      '| step | engine | PyTorch fp32 | PyTorch fp64 | engine − fp64 | fp32 − fp64 | closest ReLU tie (fp64) |',
      '| --- | --- | --- | --- | --- | --- | --- |',
      ...engine.losses.map((l, s) => {
        const [e, t, x] = [mean(l), mean(fp32.losses[s]), mean(fp64.losses[s])];
        return `| ${s + 1} | ${fmt(e, 4)} | ${fmt(t, 4)} | ${fmt(x, 4)} | ${(e - x).toExponential(1)} | ${(t - x).toExponential(1)} | ${fp64.margins[s].toExponential(1)} |`;
      }),
      '',
      '(the mean of the ranks\' training losses at each step)',
      '',
      '| run | mean training loss of the epoch | test accuracy after it (PyTorch, saved statistics) | test loss |',
      '| --- | --- | --- | --- |',
      ...runs.map((r, i) => `| ${r.name} | ${fmt(mean(r.losses.flat()), 4)} | ${fmt(100 * tested[i].accuracy, 1)}% | ${fmt(tested[i].loss, 3)} |`),
      ...(o.next ? [`| the run's own epoch-${o.from + 1} checkpoint | — | ${fmt(100 * tested[3].accuracy, 1)}% | ${fmt(tested[3].loss, 3)} |`] : []),
      '',
    ];
    const record = readEpochRecord(o.run, o.from + 1);
    const rankZero = mean(engine.losses.map((l) => l[0]));
    if (record) lines.push(`Rank 0's mean training loss in the replay: ${rankZero}; in the run's own record of epoch ${o.from + 1}: ${record.trainLoss}.`);
    if (o.next) {
      const d = await stateDistance(engine.final, path.join(o.next, 'model.safetensors'));
      lines.push(d.relative === 0
        ? `The replay's final state (weights and statistics) equals the run's epoch-${o.from + 1} checkpoint bit for bit.`
        : `The replay's final state differs from the run's epoch-${o.from + 1} checkpoint by up to ${d.relative.toExponential(2)} relative (${d.name}).`);
    }
    lines.push('');
    const text = lines.join('\n');
    process.stdout.write(`${text}\n`);
    if (o.out) fs.writeFileSync(o.out, `${text}\n`);
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
}

runMain('collapse-replay.js', main);
