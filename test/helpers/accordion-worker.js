// One worker of a data-parallel Accordion job: joins the job through its environment (RANK,
// WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ACCORDION_JOB_TOKEN), trains with Trainer and prints one JSON
// line: the per-epoch records (levels, norms, ratios, lr, losses), the switches, and what the
// gradient-norm hook was given. argv[2] is the spec: { options, script }, where `options` go to
// Trainer.create and `script` names a norm script below (none: the measured norms are used).
//
// The scripts are exported so that the test derives its expected timeline from the very same
// inputs the workers feed to the trainer.
import { Trainer } from '../../lib/index.js';
import { runAsWorker } from './worker.js';

/**
 * Per-matrix norm patterns over epochs 0‥6 for a check every 2 epochs (η = 0.5). Only the values
 * at check epochs (0, 2, 4, 6) should matter; the odd epochs carry wild values so that a trainer
 * reading them would visibly decide otherwise.
 */
const TIMELINE_PATTERNS = [
  // stable from the epoch-2 check on
  [10, 1e6, 10.5, 1e-6, 10, 1e6, 10],
  // critical at the epoch-2 check, stable at the epoch-4 one
  [10, 1e-6, 30, 1e6, 31, 1e-6, 31],
  // stable at the epoch-2 check, critical again at the epoch-4 one
  [10, 1e6, 10, 1e-6, 2, 1e6, 2],
  // always critical (the norm triples between checks)
  [1, 1e-6, 3, 1e6, 9, 1e-6, 27],
  // a zero reference counts as critical; stable afterwards
  [0, 1e6, 5, 1e-6, 5, 1e6, 5],
  // ratio exactly η is critical; stable afterwards
  [10, 1e-6, 15, 1e6, 15, 1e-6, 15],
];

/**
 * Per-matrix patterns over epochs 0‥3 for a check every epoch: a switch to high compression before
 * epoch 2 and decisions after it that depend on the norms stored at the epoch-1 check, so a resumed
 * run reproduces them only if that reference survives the checkpoint.
 */
const RESUME_PATTERNS = [
  [10, 10.2, 30, 31],
  [10, 40, 41, 41],
  [7, 7.1, 7.2, 100],
];

const BATCH_NORMS = [1, 1.1, 5, 0.2];

/**
 * The norms the hook returns for `script` on `rank` in `epoch`, given the trainer's matrix flags
 * (`matrices[i]`: parameter i has more than one dimension) and the measured norms.
 *
 * - 'timeline': rank 0 follows TIMELINE_PATTERNS by matrix index; rank 1 follows them shifted by
 *   three matrices and scaled, so that rank 1's own decisions would differ from rank 0's.
 * - 'resume-hybrid': two matrices in three follow RESUME_PATTERNS, every other parameter keeps its
 *   measured norm (so the measured sums take part in the decisions too).
 * - 'resume-scripted': every parameter follows RESUME_PATTERNS (decisions that float noise between
 *   runs cannot flip).
 * - 'batch': every parameter has the same norm, BATCH_NORMS[epoch]: stable at the epoch-1 check,
 *   critical at every later one.
 * - 'steady': every norm 1 in every epoch: stable at every check after epoch 0.
 */
export function scriptedNorms(script, rank, epoch, matrices, measured) {
  let m = -1;
  return matrices.map((isMatrix, i) => {
    if (isMatrix) m++;
    const k = isMatrix ? m : i;
    switch (script) {
      case 'timeline': {
        const patterns = TIMELINE_PATTERNS;
        if (rank === 0) return patterns[k % patterns.length][epoch];
        return 3.7 * patterns[(k + 3) % patterns.length][epoch] + 0.1 * (k % 5);
      }
      case 'resume-hybrid':
        return isMatrix && k % 3 !== 2 ? RESUME_PATTERNS[k % 3][epoch] : measured[i];
      case 'resume-scripted':
        return RESUME_PATTERNS[k % RESUME_PATTERNS.length][epoch];
      case 'batch':
        return BATCH_NORMS[epoch];
      case 'steady':
        return 1;
      default:
        throw new Error(`unknown norm script '${script}'`);
    }
  });
}

/** The parts of an epoch record that must not depend on timing. */
export function epochFacts(r) {
  const { epoch, lr, trainLoss, trainAccuracy, testLoss, testAccuracy, samples, floatsSent, floatsSentTotal, batchSize, levels, norms, ratios } = r;
  return { epoch, lr, trainLoss, trainAccuracy, testLoss, testAccuracy, samples, floatsSent, floatsSentTotal, batchSize, levels, norms, ratios };
}

/**
 * Runs one trainer (alone, or in the job the environment describes) and returns what it did.
 * `hookCalls` lists, per call of the norm hook, the epoch, the rank and the measured norms.
 */
export async function runTrainer(options, script) {
  const hookCalls = [];
  let matrices;
  const context = script
    ? {
        gradientNorms(epoch, rank, measured) {
          hookCalls.push({ epoch, rank, measured: [...measured] });
          return scriptedNorms(script, rank, epoch - 1, matrices, measured); // the scripts count from 0
        },
      }
    : {};
  const trainer = await Trainer.create(options, context);
  try {
    matrices = trainer.model.parameters().map((p) => p.shape.length > 1);
    const events = { epoch: [], switch: [], 'batch-switch': [], step: [] };
    trainer.on('epoch', (r) => events.epoch.push(epochFacts(r)));
    trainer.on('switch', (s) => events.switch.push(s));
    trainer.on('batch-switch', (s) => events['batch-switch'].push(s));
    trainer.on('step', (s) => events.step.push({ epoch: s.epoch, step: s.step, steps: s.steps, samples: s.samples }));
    const summary = await trainer.fit();
    return {
      rank: trainer.rank,
      parameterNames: trainer.model.parameters().map((p) => p.name),
      matrices,
      epochs: summary.epochs.map(epochFacts),
      switches: summary.switches,
      events,
      hookCalls,
      trainer,
    };
  } catch (err) {
    await trainer.dispose();
    throw err;
  }
}

async function main(spec) {
  const { trainer, ...result } = await runTrainer(spec.options, spec.script);
  await trainer.dispose();
  process.stdout.write(JSON.stringify(result) + '\n');
}

runAsWorker(import.meta.url, main);
