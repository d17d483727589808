/**
 * The Trainer: the epoch loop of a run. Each epoch sets the policy's learning rate and batch, runs
 * one native call per training step (emitting 'step'), lets the policy decide at the epoch's end,
 * checks the replicas, evaluates, records, and checkpoints. Everything per element happens in native
 * code; set-up is in setup.ts, the decisions in policies/.
 */
import { EventEmitter } from 'node:events';
import type { MetricsLog } from '../base/metrics.js';
import type { TrainConfig } from '../config/options.js';
import type { CompressionSpec } from '../config/compression.js';
import type { LevelCost, StepResult } from '../native/binding.js';
import type { ProcessGroup } from '../comm/group.js';
import type { Model } from '../engine/model.js';
import { saveCheckpoint } from './checkpoint.js';
import { DenseStart } from './dense-start.js';
import { savedConfig, type TrainOptions } from './config.js';
import { LinkMonitor, ProbeSchedule, collectiveSamples, estimateLink, measureLink, type CollectiveSample, type LinkEstimate } from './link.js';
import { ProgressBar, epochLine } from './progress.js';
import { openRunDir, writeSummary } from './rundir.js';
import { learningRateForEpoch, type LrSchedule } from './rules/schedule.js';
import { setUp, type SetUp, type TrainerContext } from './setup.js';
import type { TrainingTask } from './tasks.js';
import { addStepFigures, partialRecord, zeroStepFigures, type CheckpointEvent, type EpochRecord, type EvaluationEvent, type LevelSwitch, type StepEvent, type TrainSummary } from './records.js';
import { choosePolicy } from './policies/choose.js';
import type { CheckOutput, Policy, StepOutput } from './policies/policy.js';

export class Trainer extends EventEmitter {
  readonly config: TrainConfig;
  /** The run's compression: compressor, levels and candidates. */
  readonly spec: CompressionSpec;
  readonly model: Model;
  /** The data the run iterates over (images or token windows). */
  readonly task: TrainingTask;
  /** The workers of a data-parallel run (undefined when training alone). */
  readonly group?: ProcessGroup;
  private readonly ownsGroup: boolean;
  private readonly schedule: LrSchedule;
  private readonly policy: Policy;
  private readonly matrices: boolean[];
  private readonly normSource?: TrainerContext['gradientNorms'];
  private startEpoch = 0;
  private history: EpochRecord[] = [];
  private switches: LevelSwitch[] = [];
  private metrics?: MetricsLog;
  private stopRequested = false;
  /** Steps run since the run began, a resumed run's earlier steps included. */
  private runSteps = 0;
  private readonly denseStart: DenseStart;
  /** The link over the last steps' collectives. */
  private readonly link = new LinkMonitor();
  /** When a policy that follows the link has it probed (from the step this run starts at). */
  private readonly probes: ProbeSchedule;
  private denseStartSaved?: number[];

  private constructor(s: SetUp, context: TrainerContext) {
    super();
    this.config = s.config;
    this.spec = s.spec;
    this.task = s.task;
    this.model = s.model;
    this.group = s.group;
    this.ownsGroup = s.ownsGroup;
    this.normSource = context.gradientNorms;
    this.matrices = s.model.parameters().map((p) => p.shape.length > 1);
    const c = s.config;
    this.schedule = { base: c.lr, workers: c.workers, warmupEpochs: c.warmupEpochs, milestones: c.milestones, decay: c.lrDecay };
    this.policy = (context.policy ?? choosePolicy)({ config: c, spec: s.spec, schedule: this.schedule, matrices: this.matrices });
    this.denseStart = new DenseStart(c.compressAfter);
    if (s.resumed) {
      this.startEpoch = s.resumed.epochsCompleted;
      this.history = s.resumed.history;
      this.switches = s.resumed.switches;
      this.policy.restore(s.resumed.extra);
      this.runSteps = this.history.reduce((sum, r) => sum + r.steps, 0);
      this.denseStartSaved = s.resumed.extra.denseStartLevels as number[] | undefined;
    }
    this.probes = new ProbeSchedule(this.runSteps);
  }

  /** This worker's rank (0 when training alone); rank 0 reports, logs and writes the model. */
  get rank(): number {
    return this.group?.rank ?? 0;
  }

  /**
   * Reads the data, builds the model and, with `resume`, restores the checkpoint. In a process
   * started by the launcher (RANK, WORLD_SIZE … in the environment) or given `group`, it joins the
   * data-parallel job: the workers check that their configurations agree, and start from rank 0's
   * weights (resuming, each rank from its own checkpointed state).
   */
  static async create(options: TrainOptions, context: TrainerContext = {}): Promise<Trainer> {
    return new Trainer(await setUp(options, context), context);
  }

  /** Asks the loop to stop after the current step; the last checkpoint stays valid. */
  stop(): void {
    this.stopRequested = true;
  }

  /** The records of the epochs completed so far (a resumed run's included). */
  get completedEpochs(): readonly EpochRecord[] {
    return this.history;
  }

  /** True when stop() ended the run before its last epoch was completed. */
  get interrupted(): boolean {
    return this.stopRequested && this.history.length < this.config.epochs;
  }

  /** Trains from the current position to `config.epochs`, evaluating after every epoch. */
  async fit(): Promise<TrainSummary> {
    const { config } = this;
    const started = performance.now();
    const reporting = this.rank === 0;
    if (config.outDir && reporting) this.metrics = await openRunDir(config.outDir, config, savedConfig(config));
    this.metrics?.write({
      event: this.startEpoch > 0 ? 'resume' : 'start',
      epochsCompleted: this.startEpoch,
      model: config.model,
      dataset: config.dataset,
      workers: config.workers,
      compressor: config.compressor,
      commDtype: config.commDtype,
      accordion: config.accordion === 'on',
      adapt: config.adapt,
      eta: config.eta,
      accordionInterval: config.accordionInterval,
      rank: config.rank,
      topkRatio: config.topkRatio,
      parameterNames: this.model.parameters().map((p) => p.name),
      parameterSizes: this.model.parameters().map((p) => p.shape.reduce((a, b) => a * b, 1)),
      parameterShapes: this.model.parameters().map((p) => p.shape),
      matrices: this.matrices,
      parameters: this.model.parameterCount(),
      trainSamples: this.task.trainSamples,
      testSamples: this.task.testSamples,
    });
    // A policy that prices levels in seconds needs the link: measured once, kept in the checkpoints.
    if (this.group && this.policy.needsLink()) {
      const { allReducedFloats, ...link } = await measureLink(this.group);
      this.policy.useLink(link);
      this.metrics?.write({ event: 'link', ...link, allReducedFloats });
    }
    await this.denseStart.begin(this.model, this.runSteps, this.denseStartSaved);
    try {
      for (let epoch = this.startEpoch; epoch < config.epochs && !this.stopRequested; epoch++) {
        const record = await this.runEpoch(epoch);
        if (this.stopRequested) break;
        this.history.push(record);
        this.metrics?.write({ event: 'epoch', ...record });
        this.emit('epoch', record);
        if (config.progress && reporting) process.stderr.write(epochLine(record, config.epochs, this.matrices));
        const last = epoch + 1 === config.epochs;
        if (config.outDir && ((epoch + 1) % config.checkpointEvery === 0 || last)) await this.checkpoint(epoch + 1);
      }
      if (this.interrupted) this.metrics?.write({ event: 'interrupted', epochsCompleted: this.history.length });
    } catch (err) {
      this.metrics?.write({ event: 'error', code: (err as { code?: string }).code, message: (err as Error).message });
      throw err;
    } finally {
      this.metrics?.close();
      this.metrics = undefined;
    }
    const summary = this.summary((performance.now() - started) / 1000);
    if (config.outDir && reporting) await writeSummary(config.outDir, summary);
    return summary;
  }

  /**
   * Loss, accuracy (next-word accuracy for a language model) and perplexity on a split; each worker
   * evaluates its shard and the totals are summed.
   */
  async evaluate(split: 'valid' | 'test' = 'test'): Promise<{ loss: number; accuracy: number; perplexity: number; samples: number }> {
    const r = await this.task.evaluate(this.model, split);
    const totals = new Float64Array([r.lossSum, r.correct, r.samples]);
    if (this.group) {
      const wire = new Float32Array(totals);
      await this.group.allReduce(wire);
      totals.set(wire);
    }
    const [lossSum, correct, samples] = totals as unknown as [number, number, number];
    const loss = lossSum / Math.max(samples, 1);
    return { loss, accuracy: correct / Math.max(samples, 1), perplexity: Math.exp(loss), samples };
  }

  async dispose(): Promise<void> {
    await this.model.dispose();
    if (this.ownsGroup) await this.group?.dispose();
  }

  private async runEpoch(epoch: number): Promise<EpochRecord> {
    const { config } = this;
    const { lr, batch } = this.policy.plan(epoch);
    const microBatches = batch / (config.batchSize * config.workers);
    await this.model.setLearningRate(lr);
    const steps = await this.task.startEpoch(this.model, epoch, microBatches);
    const bar = config.progress && this.rank === 0 ? new ProgressBar(`epoch ${epoch + 1}/${config.epochs}`, steps) : undefined;
    const begin = performance.now();
    /** Seconds the evaluations within the epoch took: off its clock. */
    let paused = 0;
    const evaluateAfter = evaluationSteps(steps, config.evalsPerEpoch);
    const evaluations: EvaluationEvent[] = [];
    let lossSum = 0, correct = 0, samples = 0, stepsDone = 0, probeFloats = 0, probeSeconds = 0;
    const figures = zeroStepFigures();
    const collectives: CollectiveSample[][] = [];
    const levels = this.policy.setsLevels ? Array.from(await this.model.levels()) : undefined;
    for (let step = 0; step < steps; step++) {
      const stepStart = performance.now();
      const r: StepResult | null = await this.task.step(this.model, microBatches);
      if (!r) break;
      this.probes.addStep((performance.now() - stepStart) / 1000);
      stepsDone++;
      await this.denseStart.stepDone(this.model, ++this.runSteps);
      lossSum += r.loss * r.samples;
      correct += r.correct;
      samples += r.samples;
      addStepFigures(figures, r);
      const stepCollectives = collectiveSamples(r.collectives);
      // A policy that follows the link has it probed where the exchange cannot measure it: every
      // worker alike, about PROBE_SHARE of the training time (link.ts ProbeSchedule).
      if (this.group && this.policy.followsLink() && this.probes.due(this.runSteps, stepCollectives)) {
        const probe = await this.probes.probe(this.group, this.runSteps);
        stepCollectives.push(...probe.samples);
        probeFloats += probe.allReducedFloats;
        probeSeconds += probe.seconds;
        this.metrics?.write({ event: 'probe', epoch: epoch + 1, runStep: this.runSteps, ...probe });
      }
      collectives.push(stepCollectives);
      const link = this.link.addStep(stepCollectives);
      const replanned = await this.policy.afterStep({ epoch: epoch + 1, runStep: this.runSteps, link, broadcast: this.fromRank0 });
      if (replanned) await this.applyLevels(epoch, replanned, this.runSteps);
      const elapsed = Math.max((performance.now() - begin) / 1000 - paused, 1e-9);
      const event: StepEvent = {
        epoch: epoch + 1,
        step: step + 1,
        steps,
        lr,
        loss: r.loss,
        correct: r.correct,
        samples: r.samples,
        floatsSent: r.floatsSent,
        epochLoss: lossSum / Math.max(samples, 1),
        epochAccuracy: correct / Math.max(samples, 1),
        epochSamples: samples,
        epochFloatsSent: figures.floatsSent,
        seconds: elapsed,
        samplesPerSecond: samples / elapsed,
        etaSeconds: (elapsed / (step + 1)) * (steps - step - 1),
        ...(link ? { link } : {}),
      };
      this.emit('step', event);
      bar?.update(event);
      if (this.stopRequested) break;
      if (evaluateAfter.has(stepsDone)) {
        const pause = performance.now();
        figures.broadcastFloats += await this.model.syncReplicas();
        const test = await this.evaluate('test');
        const evaluation = { epoch: epoch + 1, step: stepsDone, steps, seconds: elapsed, testLoss: test.loss, testAccuracy: test.accuracy };
        evaluations.push(evaluation);
        this.emit('evaluation', evaluation);
        paused += (performance.now() - pause) / 1000;
      }
    }
    bar?.finish();
    const seconds = (performance.now() - begin) / 1000 - paused;
    if (this.stopRequested) return partialRecord(epoch, lr, batch, seconds); // discarded by fit()
    const link = estimateLink(collectives);
    const bookkeepingStart = performance.now();
    const decision = await this.checkPolicy(epoch, lr, link, figures.computeSeconds / Math.max(stepsDone, 1));
    const bookkeepingSeconds = (performance.now() - bookkeepingStart) / 1000;
    // Evaluation and the checkpoint see rank 0's model on every worker, checked by digest.
    const syncStart = performance.now();
    figures.broadcastFloats += await this.model.syncReplicas();
    const syncSeconds = (performance.now() - syncStart) / 1000;
    const language = this.task.kind === 'language';
    const valid = language ? await this.evaluate('valid') : undefined;
    const test = await this.evaluate('test');
    return {
      epoch: epoch + 1,
      lr,
      trainLoss: lossSum / Math.max(samples, 1),
      trainAccuracy: correct / Math.max(samples, 1),
      testLoss: test.loss,
      testAccuracy: test.accuracy,
      ...(valid ? { validLoss: valid.loss, validPerplexity: valid.perplexity, testPerplexity: test.perplexity } : {}),
      samples,
      steps: stepsDone,
      seconds,
      samplesPerSecond: samples / seconds,
      ...figures,
      floatsSentTotal: (this.history[this.history.length - 1]?.floatsSentTotal ?? 0) + figures.floatsSent,
      bytesSentTotal: (this.history[this.history.length - 1]?.bytesSentTotal ?? 0) + figures.bytesSent,
      ...(link ? { link } : {}),
      ...(probeFloats ? { probeFloats, probeSeconds } : {}),
      batchSize: batch,
      bookkeepingSeconds,
      syncSeconds,
      ...(levels ? { levels } : {}),
      ...(levels && decision.record ? { norms: decision.record.norms, ratios: decision.record.ratios } : {}),
      ...(decision.record?.auto ? { auto: decision.record.auto } : {}),
      ...(evaluations.length ? { evaluations } : {}),
    };
  }

  /**
   * The end of an epoch: rank 0 first measures the candidate levels the policy asks for (on the
   * epoch's gradient sums), then the norms are read once (restarting the sums), and the policy
   * decides; its new levels are set on every worker, and its switches logged and emitted.
   */
  private async checkPolicy(epoch: number, lr: number, link: LinkEstimate | undefined, computeSeconds: number): Promise<CheckOutput> {
    if (!this.policy.usesNorms) return {};
    const candidates = this.policy.candidates(epoch);
    const costs: LevelCost[][] | undefined = candidates && this.rank === 0 ? await this.model.levelCosts(candidates) : undefined;
    const measured = Array.from(await this.model.gradientNorms());
    const norms = this.normSource ? this.normSource(epoch + 1, this.rank, measured) : measured;
    const levels = this.policy.setsLevels ? await this.denseStart.levels(this.model) : [];
    const out = await this.policy.check({
      epoch,
      lr,
      lrCurrent: learningRateForEpoch(epoch, this.schedule),
      lrNext: learningRateForEpoch(epoch + 1, this.schedule),
      norms,
      levels,
      costs,
      ...(link ? { link } : {}),
      computeSeconds,
      runStep: this.runSteps,
      broadcast: this.fromRank0,
    });
    if (out.levels) await this.applyLevels(epoch, { levels: out.levels, reasons: out.reasons!, ...(out.replan ? { replan: out.replan } : {}) });
    if (out.batch) {
      const event = { epoch: epoch + 1, ...out.batch };
      this.metrics?.write({ event: 'batch-switch', ...event });
      this.emit('batch-switch', event);
    }
    return out;
  }

  /** Rank 0's values to every worker, in place (nothing alone). */
  private readonly fromRank0 = async (values: Float32Array): Promise<void> => void (await this.group?.broadcast(values, 0));

  /**
   * Sets the policy's levels and logs every matrix whose level changed, and a re-plan for a link that
   * moved; `runStep` where they change between epochs (after that step of the run).
   */
  private async applyLevels(epoch: number, out: StepOutput, runStep?: number): Promise<void> {
    const before = await this.denseStart.levels(this.model);
    const after = out.levels;
    await this.denseStart.setLevels(this.model, after);
    if (out.replan) {
      this.metrics?.write({ event: 'replan', ...out.replan });
      this.emit('replan', out.replan);
    }
    const names = this.model.parameters().map((p) => p.name);
    for (let i = 0; i < after.length; i++) {
      if (!this.matrices[i] || after[i] === before[i]) continue;
      const change: LevelSwitch = { epoch: epoch + 1, parameter: names[i]!, from: before[i]!, to: after[i]!, reason: out.reasons[i]!, ...(runStep !== undefined ? { runStep } : {}) };
      this.switches.push(change);
      this.metrics?.write({ event: 'switch', ...change });
      this.emit('switch', change);
    }
  }

  private async checkpoint(epochsCompleted: number): Promise<void> {
    const started = performance.now();
    const { outDir, ...config } = savedConfig(this.config);
    const extra = { history: this.history, switches: this.switches, ...this.policy.save(), ...this.denseStart.save() };
    const dir = await saveCheckpoint(outDir as string, this.model, { epochsCompleted, config, extra }, this.group);
    this.metrics?.write({ event: 'checkpoint', epoch: epochsCompleted, path: dir });
    const event: CheckpointEvent = { epoch: epochsCompleted, path: dir, seconds: (performance.now() - started) / 1000 };
    this.emit('checkpoint', event);
  }

  private summary(seconds: number): TrainSummary {
    const acc = this.history.map((h) => h.testAccuracy);
    return {
      model: this.config.model,
      dataset: this.config.dataset,
      parameters: this.model.parameterCount(),
      epochs: this.history,
      finalTestAccuracy: acc.length ? acc[acc.length - 1]! : NaN,
      bestTestAccuracy: acc.length ? Math.max(...acc) : NaN,
      compressor: this.config.compressor,
      accordion: this.config.accordion === 'on',
      switches: this.switches,
      floatsSentTotal: this.history[this.history.length - 1]?.floatsSentTotal ?? 0,
      seconds,
      runDir: this.config.outDir,
      ...(this.interrupted ? { interrupted: true } : {}),
    };
  }
}

/**
 * The steps after which an epoch of `steps` steps evaluates within it, `perEpoch` evaluations in all
 * with the last at its end: evenly spaced, rounded to whole steps, none twice or at the end.
 */
export function evaluationSteps(steps: number, perEpoch: number): Set<number> {
  const after = new Set<number>();
  for (let k = 1; k < perEpoch; k++) {
    const step = Math.round((k * steps) / perEpoch);
    if (step > 0 && step < steps) after.add(step);
  }
  return after;
}
