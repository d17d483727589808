/**
 * `accordion train`: one run from the command line (or, with --workers N outside a launched job, N
 * of them through the launcher, or with --in-process as N trainers in this process), its signals, and
 * what it prints at the start and the end.
 */
import * as os from 'node:os';
import * as path from 'node:path';
import { AccordionError, DataError, UsageError, reportFailure, signalExitCode } from '../base/errors.js';
import { ARCHITECTURES, type TrainConfig } from '../config/options.js';
import { LAUNCHER_NAMES } from '../comm/environment.js';
import { distributedEnv, type DistributedEnv } from '../comm/group.js';
import { connectLocalGroups, type LocalGroups } from '../comm/local.js';
import { watchLifeline } from '../comm/lifeline.js';
import { SharedData } from '../data/shared.js';
import { splitTextFile } from '../data/wikitext.js';
import { resolveCheckpointDir, savedRunConfig } from '../train/checkpoint.js';
import { resumedOptions } from '../train/config.js';
import type { EpochRecord, TrainSummary } from '../train/records.js';
import { binding } from '../native/binding.js';
import { Trainer } from '../train/trainer.js';
import { writeReport } from '../report/report.js';
import { parseTrainArgs, trainHelp, type TrainArgs } from './args.js';
import { describeCompressor, describeSwitches } from './describe.js';
import { defaultRunDir, runLaunch } from './launch.js';

export async function train(argv: string[]): Promise<number> {
  const parsed = parseTrainArgs(argv);
  if (parsed.help) {
    process.stdout.write(trainHelp() + '\n');
    return 0;
  }
  const distributed = distributedEnv();
  // A resume starts from the run's own configuration (a missing run is named before anything else),
  // on the run's own number of workers unless --workers changes it.
  const args: TrainArgs = parsed.resume === undefined ? parsed : resumedOptions(parsed);
  if (parsed.resume !== undefined && !distributed && args.workers === undefined) {
    const workers = savedRunConfig(parsed.resume).config.workers;
    if (typeof workers === 'number' && workers > 1) args.workers = workers;
  }
  if (!args.model) throw new UsageError(`option --model is required (one of: ${ARCHITECTURES.join(', ')})`);
  // A worker of `accordion launch` stops the moment its launcher is gone, even one killed outright,
  // as if the launcher had stopped it with SIGTERM: leaving now keeps the last complete checkpoint.
  watchLifeline(() => process.exit(signalExitCode('SIGTERM')));
  const inProcess = args.inProcess === true;
  delete args.inProcess;
  const workers = typeof args.workers === 'number' ? args.workers : 1;
  if (inProcess && distributed)
    throw new UsageError(`option --in-process runs a job's workers in one process; under ${LAUNCHER_NAMES[distributed.launcher]} each process is one worker already`);
  if (inProcess && workers < 2) throw new UsageError('option --in-process needs --workers N with N above 1');
  // --workers N outside a launched job: become the launcher of N workers on this machine.
  if (!distributed && !inProcess && workers > 1) {
    return runLaunch({ nprocPerNode: workers, masterPort: 0, trainArgs: argv });
  }
  // The default run directory is stamped with each process's own clock; `accordion launch` picks one.
  if (distributed && distributed.launcher !== 'accordion' && distributed.worldSize > 1 && !args.outDir && !args.resume)
    throw new UsageError(`under ${LAUNCHER_NAMES[distributed.launcher]} the ranks write one run directory: give every rank the same --out (or --resume)`);
  // --data alone names CIFAR-10 (WikiText-2 for the lstm); a resumed run's dataset is its own.
  if (parsed.dataDir && !args.dataset && parsed.resume === undefined) args.dataset = args.model === 'lstm' ? 'wikitext2' : 'cifar10';
  // The library prints nothing unless asked; the command line shows progress unless --quiet.
  args.progress ??= true;
  args.outDir ??= args.resume ? undefined : defaultRunDir(String(args.model));
  if (args.text !== undefined) {
    // --text names the data anew: a resumed run's own split gives way to it.
    if (parsed.dataDir === undefined) delete args.dataDir;
    useTextFile(args);
  }
  if (!inProcess) return runTrainers(args, distributed, 1);
  // Each worker takes the threads a launched one would: --threads, else OMP_NUM_THREADS, else its share of the cores.
  args.threads ??= Number(process.env.OMP_NUM_THREADS) || Math.max(1, Math.floor(os.availableParallelism() / workers));
  // A failed worker leaves the others waiting in a collective: the job ends with the process, as a
  // launched job ends with its workers (a checkpoint being written is a temporary directory, so the
  // last complete one is kept).
  return runTrainers(args, undefined, workers).catch((err) => process.exit(reportFailure(err)));
}

type TrainerOptions = Partial<TrainConfig> & { model: TrainConfig['model'] };

/**
 * Trains the run: one trainer (this process's worker), or `workers` of them in this process, joined
 * over groups of its own. Rank 0 prints the headline, the progress and the summary, and keeps the report.
 */
async function runTrainers(args: TrainArgs, distributed: DistributedEnv | undefined, workers: number): Promise<number> {
  // A signal while the data is read and the model built: nothing has been trained or written yet.
  const onEarlySignal = (signal: NodeJS.Signals) => {
    process.stderr.write(`\naccordion: interrupted by ${signal} before training started; no checkpoint was written\n`);
    process.exit(signalExitCode(signal));
  };
  process.once('SIGINT', onEarlySignal);
  process.once('SIGTERM', onEarlySignal);
  let local: LocalGroups | undefined;
  let trainers: Trainer[];
  try {
    if (workers > 1) {
      local = await connectLocalGroups(workers, args.timeoutMs);
      const sharedData = new SharedData();
      trainers = await Promise.all(local.groups.map((group, rank) => onRank(rank, Trainer.create(args as TrainerOptions, { group, localRank: rank, sharedData }))));
    } else {
      trainers = [await Trainer.create(args as TrainerOptions)];
    }
  } finally {
    process.off('SIGINT', onEarlySignal);
    process.off('SIGTERM', onEarlySignal);
  }
  const trainer = trainers[0]!;
  let stoppedBy: NodeJS.Signals | undefined;
  const onSignal = (signal: NodeJS.Signals) => {
    if (distributed) {
      // The other workers are being stopped too; a checkpoint being written is a temporary
      // directory, so leaving now keeps the last complete one.
      process.exit(signalExitCode(signal));
    }
    if (workers > 1) {
      // The workers here could stop a step apart and wait for each other: they stop with the process.
      process.stderr.write('\n' + describeInterruption(signal, trainer.completedEpochs, trainer.config, ' --in-process'));
      process.exit(signalExitCode(signal));
    }
    stoppedBy = signal;
    process.stderr.write(`\n${signal}: stopping after the current step; the last checkpoint is kept\n`);
    trainer.stop();
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  const { config } = trainer;
  const reporting = trainer.rank === 0;
  if (reporting && config.precision === 'bf16' && config.device === 'cpu' && binding.buildInfo().cpu.bf16 === 'rounded')
    process.stderr.write(
      `accordion: this CPU (${binding.buildInfo().cpu.isa}) has no bf16 instructions (AVX512-BF16 or AMX): --precision bf16 rounds each product's inputs to bf16 and multiplies in fp32, bf16's numerics at about fp32's speed\n`,
    );
  if (reporting) process.stderr.write(
    `accordion: ${config.model} (${trainer.model.parameterCount().toLocaleString('en-US')} parameters) on ${config.dataset}` +
      ` (${trainer.task.trainSamples} train / ${trainer.task.testSamples} test ${trainer.task.kind === 'language' ? 'tokens' : 'images'}), ${config.epochs} epochs,` +
      ` batch ${config.batchSize}${config.workers > 1 ? ` per worker × ${config.workers} workers${workers > 1 ? ' in this process' : ''}` : ''}, device ${config.device}, compressor ${describeCompressor(config)}, run directory ${config.outDir}\n`,
  );
  const report = reporting && config.outDir ? keepReport(trainer, config.outDir) : undefined;
  try {
    const [summary] = await Promise.all(trainers.map((t, rank) => (local ? onRank(rank, t.fit()) : t.fit())));
    const reportFile = await report?.();
    if (stoppedBy && summary!.interrupted) {
      process.stderr.write(describeInterruption(stoppedBy, summary!.epochs, config));
      return signalExitCode(stoppedBy);
    }
    if (reporting) process.stdout.write(describeSummary(summary!, config, reportFile));
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
    await Promise.all(trainers.map((t) => t.dispose()));
    await local?.dispose();
  }
  return 0;
}

/** In one process, a worker's failure names its rank (a usage error is every rank's alike); a launched worker's launcher names it. */
function onRank<T>(rank: number, work: Promise<T>): Promise<T> {
  return work.catch((err: unknown) => {
    if (err instanceof AccordionError && !(err instanceof UsageError)) err.message = `rank ${rank}: ${err.message}`;
    throw err;
  });
}

/** What a finished run prints: the model and data, time, accuracy, traffic and the level switches. */
function describeSummary(summary: TrainSummary, config: TrainConfig, reportFile: string | undefined): string {
  const last = summary.epochs[summary.epochs.length - 1];
  return (
    [
      `model ${summary.model}, ${summary.parameters.toLocaleString('en-US')} parameters, dataset ${summary.dataset}`,
      `epochs ${summary.epochs.length}, time ${summary.seconds.toFixed(1)} s` +
        (last ? `, ${last.samplesPerSecond.toFixed(1)} samples/s in the last epoch` : ''),
      `final test accuracy ${(100 * summary.finalTestAccuracy).toFixed(2)}%, best ${(100 * summary.bestTestAccuracy).toFixed(2)}%` +
        (last?.testPerplexity !== undefined ? `; perplexity: validation ${last.validPerplexity!.toFixed(2)}, test ${last.testPerplexity.toFixed(2)}` : ''),
      `compressor ${describeCompressor(config)}: ${summary.floatsSentTotal.toLocaleString('en-US')} floats sent by this worker` +
        (last ? ` (${last.floatsSent.toLocaleString('en-US')} in the last epoch)` : '') +
        `, ${(last?.bytesSentTotal ?? 0).toLocaleString('en-US')} bytes in ${config.commDtype}`,
      ...(config.adapt !== 'compression' && config.adapt !== 'auto' && summary.epochs.length
        ? [`global batch ${summary.epochs[0]!.batchSize} → ${summary.epochs[summary.epochs.length - 1]!.batchSize} (${config.adapt === 'smith' ? 'grown at the LR milestones' : 'Accordion on the whole-model norm'})`]
        : []),
      ...(summary.accordion ? [`Accordion: ${summary.switches.length} level switch${summary.switches.length === 1 ? '' : 'es'}`, ...describeSwitches(summary)] : []),
      `run directory ${summary.runDir}`,
      ...(reportFile ? [`report ${reportFile}`] : []),
    ].join('\n') + '\n'
  );
}

/**
 * The run's report.html, written after every epoch (one write at a time, off the event loop, as the
 * checkpoints are); the returned function writes it a last time and resolves to its path (undefined
 * if it could not be written: a warning says why, and training goes on without it).
 */
function keepReport(trainer: Trainer, runDir: string): () => Promise<string | undefined> {
  let written: Promise<string | undefined> = Promise.resolve(undefined);
  const write = () => {
    written = written.then(() =>
      writeReport([runDir], undefined, { onWarning: () => {} }).catch((err: Error) => {
        process.stderr.write(`accordion: warning: the report was not written: ${err.message}\n`);
        return undefined;
      }),
    );
    return written;
  };
  trainer.on('epoch', write);
  return write;
}

/**
 * --text FILE: the lstm trains on a plain text file. Its lines are split 90/5/5 into the WikiText
 * layout in the run directory's text-split/ folder (the split depends on the file only, so a resumed
 * run makes the same one), which the run then reads as --data.
 */
function useTextFile(args: Record<string, unknown>): void {
  const file = args.text as string;
  delete args.text;
  if (args.model !== 'lstm') throw new UsageError(`option --text is for --model lstm; ${String(args.model)} trains on images (--data DIR)`);
  if (args.dataDir !== undefined)
    throw new UsageError('options --text and --data exclude each other: --text FILE splits a plain text file, --data DIR reads a WikiText directory');
  if (args.dataset !== undefined && args.dataset !== 'wikitext2')
    throw new UsageError(`option --text trains the lstm on a text file, not on --dataset ${String(args.dataset)}`);
  if (file === '') throw new UsageError('option --text needs a file name');
  const runDir = typeof args.outDir === 'string' ? args.outDir : path.resolve(resolveCheckpointDir(String(args.resume)), '..', '..');
  const dir = path.join(runDir, 'text-split');
  try {
    splitTextFile(file, dir);
  } catch (err) {
    if (err instanceof DataError) throw new DataError(`option --text: ${err.message}`);
    throw err;
  }
  args.dataDir = dir;
  args.dataset = 'wikitext2';
}

/** A word as a POSIX shell reads it back. */
function shellQuote(word: string): string {
  return /^[\w@%+=:,./-]+$/.test(word) ? word : `'${word.replace(/'/g, `'\\''`)}'`;
}

/**
 * What a run stopped by a signal tells its user: how far it got, the last complete checkpoint, and
 * the command that resumes from it (the run keeps its own settings: --resume RUN_DIR alone).
 */
function describeInterruption(signal: NodeJS.Signals, epochs: readonly EpochRecord[], config: TrainConfig, resumeFlags = ''): string {
  const done = epochs.length ? epochs[epochs.length - 1]!.epoch : undefined;
  const lines = [
    `accordion: interrupted by ${signal}; this run did not finish` +
      (done !== undefined ? ` (${done} of ${config.epochs} epochs completed)` : ` (${config.epochs} epochs were planned)`),
  ];
  let checkpoint: string | undefined;
  try {
    checkpoint = config.outDir ? resolveCheckpointDir(config.outDir) : undefined;
  } catch {
    checkpoint = undefined;
  }
  if (checkpoint && config.outDir) {
    lines.push(`the last checkpoint is ${checkpoint}; resume with:`, `  accordion train --resume ${shellQuote(config.outDir)}${resumeFlags}`);
  } else {
    lines.push(`no checkpoint was written${config.outDir ? ` in ${config.outDir}` : ''}, so there is nothing to resume from`);
  }
  return lines.join('\n') + '\n';
}
