#!/usr/bin/env node
// Event-loop delay while a model trains and writes a checkpoint after every epoch: what a Node
// service that hosts a Trainer sees. perf_hooks.monitorEventLoopDelay (1 ms resolution) gives the
// p50, p99 and max over the whole of fit(); a second probe (a 5 ms timer that measures how late it
// fires) attributes each delay to what the trainer was doing: steps, evaluation or checkpoint. A
// control process that only measures its own event loop runs alongside: the delays it sees are the
// machine's (other load, and the training threads competing for the cores), not the library's.
//
//   node bench/event-loop.js [--lib DIR] [--model resnet18] [--epochs 6] [--synthetic-train 2560]
//                            [--threads N] [--device cpu|cuda] [--json out.json] [--markdown]
//
// --lib points at another build's lib/ (e.g. /work/main/lib) to measure it with the same script.
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join, resolve } from 'node:path';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { ROOT, defaultThreads, exitUnlessDevice, fmt, formatTable, loadEngine, machineInfo, positiveInt, runMain, suiteOptions, writeReport } from './common.js';

const USAGE = `usage: node bench/event-loop.js [options]
  --lib DIR              the library build to measure (default: this checkout's lib/)
  --model NAME           architecture (default resnet18)
  --epochs N             epochs, each followed by a checkpoint (default 6, the synthetic preset)
  --synthetic-train N    training images (default 2560, the synthetic preset)
  --synthetic-test N     test images (default 1000)
  --batch-size N         batch size (default 64, the synthetic preset)
  --threads N            native threads (default OMP_NUM_THREADS or 2)
  --device cpu|cuda      where the model trains (default cpu)
  --data DIR             synthetic data cache (default: a folder in the system temp directory)
  --quick                2 epochs of 256 images: a smoke run, not figures to quote
  --json FILE            also write the figures and the machine facts to FILE
  --markdown             print the result table as Markdown (for BENCHMARKS.md)`;

const OPTIONS = {
  lib: { type: 'string', default: join(ROOT, 'lib') },
  model: { type: 'string', default: 'resnet18' },
  epochs: { type: 'string' },
  'synthetic-train': { type: 'string' },
  'synthetic-test': { type: 'string' },
  'batch-size': { type: 'string', default: '64' },
  threads: { type: 'string' },
  device: { type: 'string', default: 'cpu' },
  data: { type: 'string', default: join(os.tmpdir(), 'accordion-bench-event-loop-data') },
  quick: { type: 'boolean', default: false },
};

function options(values) {
  const quick = values.quick;
  return {
    lib: resolve(values.lib),
    model: values.model,
    epochs: positiveInt('--epochs', values.epochs ?? (quick ? '2' : '6')),
    syntheticTrain: positiveInt('--synthetic-train', values['synthetic-train'] ?? (quick ? '256' : '2560')),
    syntheticTest: positiveInt('--synthetic-test', values['synthetic-test'] ?? (quick ? '128' : '1000')),
    batchSize: positiveInt('--batch-size', values['batch-size']),
    threads: values.threads === undefined ? defaultThreads() : positiveInt('--threads', values.threads),
    device: values.device,
    data: resolve(values.data),
    quick,
    json: values.json,
    markdown: values.markdown,
  };
}

const ms = (ns) => ns / 1e6;

/**
 * A timer every `period` ms that records how late it fires. A late firing is charged to the phase
 * the trainer was in when the timer should have fired (a blocking call delays the timer past the
 * phase that made the call). `phases.at(t)` names the phase at time t.
 * Returns { stop() → Map phase → { max, late, samples } }, `late` counting firings over 20 ms late.
 */
function phaseProbe(phases, period = 5) {
  const stats = new Map();
  let expected = performance.now() + period;
  let timer;
  const tick = () => {
    const now = performance.now();
    const lag = Math.max(0, now - expected);
    const phase = phases.at(expected);
    const p = stats.get(phase) ?? { max: 0, late: 0, samples: 0 };
    p.max = Math.max(p.max, lag);
    p.samples++;
    if (lag > 20) p.late++;
    stats.set(phase, p);
    expected = now + period;
    timer = setTimeout(tick, period);
  };
  timer = setTimeout(tick, period);
  return {
    stop() {
      clearTimeout(timer);
      return stats;
    },
  };
}

/** The trainer's phases over time, as a list of changes. */
function phaseLog(initial) {
  const changes = [{ time: 0, phase: initial }];
  return {
    set(phase) {
      changes.push({ time: performance.now(), phase });
    },
    at(time) {
      for (let i = changes.length - 1; i >= 0; i--) if (changes[i].time <= time) return changes[i].phase;
      return initial;
    },
  };
}

/**
 * A process that measures its own event-loop delay (same monitor) until its stdin closes, then
 * prints { p50, p99, max } in ms. `stop()` resolves to them.
 */
function controlProbe() {
  const script = `const { monitorEventLoopDelay } = require('node:perf_hooks');
    const h = monitorEventLoopDelay({ resolution: 1 });
    h.enable();
    process.stdin.resume();
    process.stdin.on('end', () => {
      h.disable();
      const ms = (ns) => ns / 1e6;
      process.stdout.write(JSON.stringify({ p50: ms(h.percentile(50)), p99: ms(h.percentile(99)), max: ms(h.max) }));
    });`;
  const child = spawn(process.execPath, ['-e', script], { stdio: ['pipe', 'pipe', 'inherit'] });
  let out = '';
  child.stdout.on('data', (d) => (out += d));
  const done = new Promise((resolve) => child.on('close', () => resolve(out ? JSON.parse(out) : { p50: NaN, p99: NaN, max: NaN })));
  return {
    stop() {
      child.stdin.end();
      return done;
    },
  };
}

async function main() {
  const opts = suiteOptions('bench/event-loop.js', USAGE, OPTIONS, options);
  const lib = await loadEngine('bench/event-loop.js', opts.lib);
  exitUnlessDevice('bench/event-loop.js', opts.device, lib.requireDevice);
  lib.setThreads(opts.threads);
  const machine = machineInfo(lib.buildInfo());
  const outDir = mkdtempSync(join(os.tmpdir(), 'accordion-bench-event-loop-'));
  console.log(`${opts.model} on synthetic data: ${opts.syntheticTrain} train / ${opts.syntheticTest} test images, batch ${opts.batchSize}, ` +
    `${opts.epochs} epochs with a checkpoint after each, ${opts.threads} threads, device ${opts.device}; library ${opts.lib}`);
  console.log(`machine: ${machine.cpu}, ${machine.cores} cores, Node ${machine.node}`);

  try {
    const trainer = await lib.Trainer.create({
      model: opts.model,
      device: opts.device,
      dataset: 'synthetic',
      dataDir: opts.data,
      syntheticTrain: opts.syntheticTrain,
      syntheticTest: opts.syntheticTest,
      batchSize: opts.batchSize,
      epochs: opts.epochs,
      checkpointEvery: 1,
      outDir: join(outDir, 'run'),
      progress: false,
    });
    // What the trainer is doing, from its events: steps until the epoch's last step, then
    // evaluation until the 'epoch' event, then the checkpoint until the 'checkpoint' event; after
    // the last one, the summary.
    const phases = phaseLog('steps');
    const checkpointMs = [];
    let checkpointStart = 0;
    trainer.on('step', (e) => {
      if (e.step === e.steps) phases.set('evaluation');
    });
    trainer.on('epoch', () => {
      phases.set('checkpoint');
      checkpointStart = performance.now();
    });
    trainer.on('checkpoint', (e) => {
      checkpointMs.push(performance.now() - checkpointStart);
      phases.set(e.epoch === opts.epochs ? 'summary' : 'steps');
    });

    const control = controlProbe();
    const histogram = monitorEventLoopDelay({ resolution: 1 });
    const probe = phaseProbe(phases);
    histogram.enable();
    const started = performance.now();
    const summary = await trainer.fit();
    const seconds = (performance.now() - started) / 1000;
    histogram.disable();
    const byPhase = probe.stop();
    const machineDelay = await control.stop();
    await trainer.dispose();

    const result = {
      p50: ms(histogram.percentile(50)),
      p99: ms(histogram.percentile(99)),
      max: ms(histogram.max),
      mean: ms(histogram.mean),
      samples: histogram.count,
      seconds,
      epochs: summary.epochs.length,
      checkpointMs,
      control: machineDelay,
      phases: Object.fromEntries([...byPhase].map(([name, p]) => [name, { maxMs: p.max, over20ms: p.late, samples: p.samples }])),
    };
    // monitorEventLoopDelay records the time between its 1 ms timer's firings: 1 ms means no delay.
    const columns = [
      { key: 'what', title: 'event-loop delay over fit()', align: 'left' },
      { key: 'p50', title: 'p50 ms' },
      { key: 'p99', title: 'p99 ms' },
      { key: 'max', title: 'max ms' },
    ];
    const rows = [
      { what: `${opts.model}, ${result.epochs} epochs, ${result.epochs} checkpoints`, p50: fmt(result.p50), p99: fmt(result.p99), max: fmt(result.max) },
      { what: 'control: an idle process alongside', p50: fmt(machineDelay.p50), p99: fmt(machineDelay.p99), max: fmt(machineDelay.max) },
    ];
    console.log(`\n${formatTable(columns, rows, { markdown: opts.markdown })}`);
    const phaseColumns = [
      { key: 'phase', title: 'phase', align: 'left' },
      { key: 'max', title: 'max delay ms' },
      { key: 'late', title: 'timer firings > 20 ms late' },
      { key: 'samples', title: 'firings' },
    ];
    const phaseRows = [...byPhase].map(([name, p]) => ({ phase: name, max: fmt(p.max), late: p.late, samples: p.samples }));
    console.log(`\nby phase (a 5 ms timer's lateness):\n${formatTable(phaseColumns, phaseRows, { markdown: opts.markdown })}`);
    console.log(`\ncheckpoint wall time per epoch (ms): ${checkpointMs.map((t) => t.toFixed(0)).join(', ')}; fit() took ${seconds.toFixed(1)} s`);
    if (opts.quick) console.log('(quick run: smoke figures only)');
    if (opts.json) {
      const report = { date: new Date().toISOString(), machine, options: { ...opts, json: undefined, markdown: undefined }, result };
      writeReport(opts.json, report);
    }
  } finally {
    rmSync(outDir, { recursive: true, force: true });
  }
  return 0;
}

runMain('bench/event-loop.js', main);
