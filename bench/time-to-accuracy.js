#!/usr/bin/env node
// Time to accuracy where the network is the bottleneck: ResNet-18 on the reproduction's workload
// (bench/reproduce.js: width 0.125, the first 12,800 Fashion-MNIST images, 32 images a worker) over
// 4 simulated hosts (`accordion cluster`), on a slow link (the dense exchange about 3 times a step's
// compute) and a fast one (about half of it), beside PyTorch DDP dense and DDP with its PowerSGD hook
// over the same shaped hosts, from the same initial weights, files and schedule.
//
// The clock is training time: the epochs' training seconds (with the engine's end-of-epoch
// bookkeeping and replica check) summed; evaluation, start-up and checkpoints are left out on both
// sides. Both evaluate the test set EVALS times an epoch (`--evals-per-epoch`), and the time to the
// target is interpolated between the evaluations around its crossing (lib/report/time-to-target.js).
// The target of a link is dense's mean final accuracy on it minus MARGIN points. Each setting (a
// link and a group of runs) is its own command; finished runs are kept, an interrupted one starts
// again. A report keeps each finished run's record beside it, and reads the records of runs whose
// folders are gone.
//
//   sudo node bench/time-to-accuracy.js run slow-dense [--seeds 1,2,3] [--configs dense,ddp] [--quick]
//   sudo node bench/time-to-accuracy.js pilot [--rates 40mbit,240mbit]  # exchange ÷ compute of a dense epoch per rate
//   node bench/time-to-accuracy.js report slow [--evals N]              # bench/results/time-to-accuracy-slow-MACHINE.md
//   node bench/time-to-accuracy.js list
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { parseArgs } from 'node:util';
import { ROOT, ddpOnShapedHosts, fmt, formatTable, meanInterval, readPeerEpochs, runLogged } from './common.js';
import { FASHION_MNIST, resolveSetting, scheduleArgs, workerArgs } from './reproduce-settings.js';
import { engineClock, evaluationsOnClock, timeToTarget } from '../lib/report/time-to-target.js';
import { readMetrics } from '../lib/base/metrics.js';
import { describeLevel } from '../lib/config/compression.js';
import { parseBandwidth } from '../lib/cluster/cluster.js';
import { missingCapabilities } from '../lib/cluster/netns.js';
import { buildInfo } from '../lib/index.js';

const HOSTS = 4;
/** The target: dense's mean final accuracy on the link less this many points (fixed before the runs). */
const MARGIN = 0.5;
/** Steps sent dense before compression starts, ours (--compress-after) and the hook's start_powerSGD_iter alike. */
const START_ITER = 2;
/** Lower targets the report shows besides, in points below dense's mean final accuracy: descriptive, never a goal. */
const LOWER = [1, 2, 4];

/**
 * The workload: the reproduction's width, data and batch, 10 epochs so that a setting's runs fit
 * 90 minutes on 2 cores (TopK 99% sends about twice dense's bytes), with the schedule's shape kept:
 * a warm-up of 1/6 of the run, ÷10 at 50% and 83% of it, a check every epoch.
 */
const EPOCHS = 10;
const WARMUP = 2;
/**
 * Test-set evaluations an epoch (the last at its end), so that a crossing of the target is
 * interpolated over a fortieth of the run at most: chosen before the runs of 2026-11-28, evening.
 */
const EVALS = 4;
const QUICK = { trainImages: 512, epochs: 2, warmupEpochs: 1 };

/**
 * Each host's egress on the two links, chosen by `pilot` (BENCHMARKS.md, Time to accuracy), and a
 * link that drops from the fast rate to the slow one and comes back (times after the hosts start).
 */
const LINKS = { slow: '60mbit', fast: '480mbit', drop: '0s:480mbit,20s:60mbit,80s:480mbit' };
/** The links of fixed rates (what the pilot tries, and DDP can run on). */
const RATES = { slow: LINKS.slow, fast: LINKS.fast };

/** The groups of runs, each a setting on each link: the family a run's levels come from, and its configs. */
const GROUPS = {
  dense: { family: 'resnet18-powersgd', configs: ['dense', 'ddp'] },
  powersgd: { family: 'resnet18-powersgd', configs: ['low', 'high', 'accordion', 'auto', 'ddp-powersgd'] },
  topk: { family: 'resnet18-topk', configs: ['low', 'high', 'accordion', 'auto'] },
  // Compression that follows the link: automatic levels planned at the checks only, over the link
  // measured at the start, against re-planning with the budget following the link.
  follow: { family: 'resnet18-powersgd', configs: ['low', 'accordion', 'auto-once', 'auto'] },
};
/** A follow run's own options, beside the automatic levels it is. */
const FOLLOW = { 'auto-once': ['--replan-factor', '0'], auto: ['--link-share', '0.25'] };
/** A run's name in a link's report: the engine's compressed runs carry their family. */
const runName = (group, config) => (group === 'dense' || config.startsWith('ddp') ? config : `${group}-${config}`);
const isPeer = (config) => config.startsWith('ddp');

const TITLES = {
  dense: 'dense', ddp: 'PyTorch DDP, dense', 'ddp-powersgd': "PyTorch DDP, PowerSGD hook at static low's rank",
  low: 'static low', high: 'static high', accordion: 'Accordion', auto: 'automatic levels, priced in seconds',
  'auto-once': 'automatic levels, planned at the checks only',
};

/**
 * The reproduction's setting of a group at this workload, evaluated `evals` times an epoch (runs of
 * other counts are kept apart: `-xN` in their folder's name).
 */
function setting(group, { quick, evals }) {
  const s = resolveSetting(GROUPS[group].family, quick ? QUICK : { epochs: EPOCHS, warmupEpochs: WARMUP });
  // Dense is every group's reference: the reproduction's arguments with no compressor.
  return { ...s, evals, tag: `${s.tag}-h${HOSTS}${evals > 1 ? `-x${evals}` : ''}`, extra: { ...s.extra, dense: () => [] } };
}

/** How often a run evaluates, the engine and PyTorch alike. */
const evalArgs = (s) => (s.evals > 1 ? ['--evals-per-epoch', String(s.evals)] : []);

/** What one engine worker trains in a config: the reproduction's arguments, compression after START_ITER steps. */
function engineArgs(s, config, seed, group) {
  if (config === 'dense') return [...workerArgs(s, 'dense', seed, FASHION_MNIST), ...evalArgs(s)];
  const auto = config.startsWith('auto');
  const own = [...(auto ? ['--auto-cost', 'seconds'] : []), ...(group === 'follow' ? (FOLLOW[config] ?? []) : []), '--compress-after', String(START_ITER)];
  return [...workerArgs(s, auto ? 'auto' : config, seed, FASHION_MNIST), ...own, ...evalArgs(s)];
}

/** PyTorch DDP's arguments (test/oracles/torch_train.py) for the same workload, schedule and weights. */
function peerArgs(s, config, seed, init) {
  const schedule = scheduleArgs(s);
  const value = (flag) => schedule[schedule.indexOf(flag) + 1];
  return [
    '--dataset', 'fashion-mnist', '--data', FASHION_MNIST, '--train-images', String(s.trainImages), '--model', 'resnet18', '--width', String(s.width),
    '--state', init, '--epochs', String(s.epochs), '--batch', String(s.batchSize), '--lr', value('--lr'), '--warmup-epochs', value('--warmup-epochs'),
    '--milestones', value('--milestones'), '--seed', String(seed), ...evalArgs(s),
    ...(config === 'ddp-powersgd' ? ['--powersgd-rank', String(s.low), '--start-powersgd-iter', String(START_ITER)] : []),
  ];
}

const runDir = (o, link, s, group, config, seed) => path.join(o.dir, link, s.tag, `${runName(group, config)}-seed${seed}`);
const finished = (run) => fs.existsSync(path.join(run, 'summary.json')) || fs.existsSync(path.join(run, 'finished'));
/**
 * This machine, as a record names it: a report reads one machine's runs, since both the times and,
 * through the kernels oneDNN picks for the CPU, the trajectories differ by machine. The model name
 * alone does not tell them apart (a virtual machine's may read just 'Intel(R) Xeon(R) Processor',
 * with or without bf16 instructions), so oneDNN's instruction set is part of it.
 */
const MACHINE = `${os.cpus()[0]?.model.trim() ?? 'unknown CPU'}, ${os.cpus().length} cores, ${buildInfo().cpu.isa}`;
/**
 * A machine in file names: its model and instruction set.
 * 'AMD EPYC, 2 cores, avx512_core_bf16' → 'amd-epyc-avx512-core-bf16',
 * 'Intel(R) Xeon(R) Platinum 8488C CPU @ 2.40GHz, 2 cores, avx512_core_amx' → 'intel-xeon-platinum-8488c-avx512-core-amx'.
 */
const machineSlug = (machine) => {
  const [model, , isa = ''] = machine.split(',').map((part) => part.trim());
  const name = model.toLowerCase().replace(/\((r|tm)\)/g, '').replace(/\s(cpu|processor)\b.*$/, '');
  return `${name} ${isa}`.replace(/[^a-z0-9]+/g, '-').replace(/^-|-$/g, '');
};
/**
 * A finished run as the report reads it (readRun), with the machine that ran it (the one that holds
 * its folder), kept beside the reports so that a report can be made again, and a link's groups
 * completed, where the runs' folders are gone. Each machine's records have a folder of their own, so
 * that a run on one machine never replaces another's.
 */
const recordFile = (o, link, s, group, config, seed) =>
  path.join(o.results, 'time-to-accuracy', machineSlug(o.machine), link, s.tag, `${runName(group, config)}-seed${seed}.json`);

/** One run on the shaped hosts, from scratch unless it finished. */
async function runOne(o, link, s, group, config, seed) {
  const run = runDir(o, link, s, group, config, seed);
  if (finished(run)) return 'kept';
  fs.rmSync(run, { recursive: true, force: true });
  fs.mkdirSync(run, { recursive: true });
  const began = Date.now();
  const rate = o.rate ?? LINKS[link];
  let code;
  if (isPeer(config)) {
    if (!RATES[link] && !o.rate) throw new Error(`PyTorch DDP runs on a link of one rate (${Object.keys(RATES).join(', ')}), not on ${link}`);
    const { Model } = await import('../lib/index.js');
    const init = path.join(run, 'init.safetensors');
    const model = await Model.create({ architecture: 'resnet18', width: s.width, classes: 10, seed });
    await model.save(init);
    await model.dispose();
    code = await ddpOnShapedHosts(HOSTS, '10.89.0.0/24', parseBandwidth(rate), peerArgs(s, config, seed, init), run);
    if (code === 0) fs.writeFileSync(path.join(run, 'finished'), '');
  } else {
    const args = [path.join(ROOT, 'lib', 'cli.js'), 'cluster', '--hosts', String(HOSTS), '--bandwidth', rate, '--', ...engineArgs(s, config, seed, group), '--out', run, '--overwrite'];
    ({ code } = await runLogged(process.execPath, args, `${run}.log`, { spawn: { env: { ...process.env, OMP_NUM_THREADS: '1' } } }));
  }
  if (code !== 0) throw new Error(`${link} ${runName(group, config)} seed ${seed} failed (exit ${code}): see ${isPeer(config) ? path.join(run, 'rank0.log') : `${run}.log`}`);
  return `${((Date.now() - began) / 60_000).toFixed(1)} min`;
}

/** A finished run's evaluations on the training clock, with its step time and floats. */
function readRun(run) {
  if (fs.existsSync(path.join(run, 'ddp.jsonl'))) {
    const epochs = readPeerEpochs(run);
    let total = 0;
    const clock = epochs.map((e) => (total += e.seconds));
    return { evaluations: evaluationsOnClock(epochs, clock), stepSeconds: total / epochs.reduce((a, e) => a + e.steps, 0) };
  }
  const lines = readMetrics(path.join(run, 'metrics.jsonl'));
  const epochs = lines.filter((e) => e.event === 'epoch');
  const plans = readPlans(lines);
  return {
    ...(plans.length ? { plans } : {}),
    evaluations: evaluationsOnClock(epochs, engineClock(epochs)),
    stepSeconds: epochs.reduce((a, e) => a + e.seconds, 0) / epochs.reduce((a, e) => a + e.steps, 0),
    computePerStep: epochs.reduce((a, e) => a + e.computeSeconds, 0) / epochs.reduce((a, e) => a + e.steps, 0),
    communicationPerStep: epochs.reduce((a, e) => a + e.communicationSeconds, 0) / epochs.reduce((a, e) => a + e.steps, 0),
    floats: epochs.at(-1).floatsSentTotal,
  };
}

/**
 * An automatic-levels run's plans, at its checks and re-plans: the epoch (and for a re-plan the step
 * from which it applies), the link it was priced at (Mbit/s), the budget's link factor
 * (--link-share) and how many matrices took each level.
 */
function readPlans(lines) {
  const compressor = lines.find((e) => e.event === 'start')?.compressor;
  const plan = (auto, bytesPerSecond, at) => {
    const levels = {};
    for (const c of auto.candidates) {
      const level = describeLevel(compressor, auto.levels[c.index]);
      levels[level] = (levels[level] ?? 0) + 1;
    }
    return { ...at, mbit: bytesPerSecond === undefined ? undefined : (bytesPerSecond * 8) / 1e6, linkFactor: auto.linkFactor, levels };
  };
  return lines.flatMap((e) =>
    e.event === 'epoch' && e.auto ? [plan(e.auto, e.auto.bytesPerSecond, { epoch: e.epoch })]
      : e.event === 'replan' ? [plan(e.plan, e.toBytesPerSecond, { epoch: e.epoch, runStep: e.runStep })]
        : [],
  );
}

/** A plan as one line: when, the link, the factor and the levels (most matrices first). */
const showPlan = (p) =>
  `${p.runStep === undefined ? `end of epoch ${p.epoch}` : `epoch ${p.epoch}, from step ${p.runStep}`}: ` +
  `${p.mbit === undefined ? 'no link' : `${fmt(p.mbit, 0)} Mbit/s`}${p.linkFactor === undefined ? '' : `, budget × ${fmt(p.linkFactor, 2)}`}; ` +
  Object.entries(p.levels).sort((a, b) => b[1] - a[1]).map(([level, n]) => `${n} ${level}`).join(', ');

const interval = (xs, digits = 2) => {
  const m = meanInterval(xs);
  return xs.length > 1 ? `${fmt(m.mean, digits)} (${fmt(m.low, digits)} … ${fmt(m.high, digits)})` : fmt(m.mean, digits);
};

/** `report LINK`: the target from dense, each run's time to it, and speed-ups paired by seed. */
function report(o, link) {
  const rows = [];
  for (const [group, { configs }] of Object.entries(GROUPS)) {
    const s = setting(group, o);
    for (const config of configs) {
      const runs = o.seeds.flatMap((seed) => {
        const dir = runDir(o, link, s, group, config, seed), record = recordFile(o, link, s, group, config, seed);
        if (o.machine === MACHINE && finished(dir)) {
          const run = { machine: MACHINE, ...readRun(dir) };
          if (!o.quick) {
            fs.mkdirSync(path.dirname(record), { recursive: true });
            fs.writeFileSync(record, JSON.stringify(run) + '\n');
          }
          return [{ seed, ...run }];
        }
        const kept = fs.existsSync(record) ? JSON.parse(fs.readFileSync(record, 'utf8')) : undefined;
        return kept?.machine === o.machine ? [{ seed, ...kept }] : [];
      });
      const title = group === 'follow' && config === 'auto' ? `automatic levels, re-planning, ${FOLLOW.auto.join(' ')}` : TITLES[config];
      if (runs.length) rows.push({ name: runName(group, config), title, group, runs });
    }
  }
  const dense = rows.find((r) => r.name === 'dense');
  if (!dense) throw new Error(`no finished dense run on the ${link} link on ${o.machine} (under ${o.dir} or kept in ${o.results}): run ${link}-dense first`);
  const target = meanInterval(dense.runs.map((r) => r.evaluations.at(-1).quality)).mean - MARGIN / 100;
  for (const row of rows) for (const r of row.runs) r.toTarget = timeToTarget(r.evaluations, target);
  /** Per seed where both reached the target: reference time ÷ this run's time. */
  const speedups = (row, reference) => {
    const ref = rows.find((r) => r.name === reference);
    if (!ref) return [];
    return row.runs.flatMap((r) => {
      const other = ref.runs.find((x) => x.seed === r.seed);
      return r.toTarget !== null && other?.toTarget != null ? [other.toTarget / r.toTarget] : [];
    });
  };
  const table = rows.map((row) => {
    const reached = row.runs.filter((r) => r.toTarget !== null);
    const vsDdp = speedups(row, 'ddp');
    const vsHook = speedups(row, 'ddp-powersgd');
    return {
      run: row.title + (row.group === 'topk' ? ' (TopK)' : row.group !== 'dense' && !isPeer(row.name) ? ' (PowerSGD)' : ''),
      final: interval(row.runs.map((r) => 100 * r.evaluations.at(-1).quality)),
      toTarget: reached.length ? `${interval(reached.map((r) => r.toTarget), 0)}${reached.length < row.runs.length ? ` (${reached.length} of ${row.runs.length})` : ''}` : 'not reached',
      step: fmt(meanInterval(row.runs.map((r) => r.stepSeconds)).mean, 3),
      vsDdp: vsDdp.length ? interval(vsDdp) : '—',
      vsHook: vsHook.length ? interval(vsHook) : '—',
      floats: row.runs[0].floats === undefined ? '' : `${fmt(meanInterval(row.runs.map((r) => r.floats)).mean / 1e6, 1)}M`,
    };
  });
  // The goals (BENCHMARKS.md, set before the runs): a paired ratio of times decides when its 95%
  // interval lies wholly on one side of the bound.
  const verdict = (what, run, reference, bound) => {
    const row = rows.find((r) => r.name === run);
    const ref = rows.find((r) => r.name === reference);
    if (!row || !ref) return `- ${what}: not run yet`;
    const reached = (r) => r.runs.filter((x) => x.toTarget !== null).length;
    // A run that never reaches the target is later than any that does.
    if (!reached(row)) return `- ${what}: ${reached(ref) ? `**not met**: it reached the target on no seed of ${row.runs.length} (the reference on ${reached(ref)})` : 'not decided: neither reached the target'}`;
    const xs = speedups(row, reference);
    // Seeds without a pair: neither run reached the target (no ratio), or one of them did, which
    // is a win (or a loss) of unknown size: it keeps the paired verdict against it from standing.
    const unpaired = row.runs.flatMap((r) => {
      const other = ref.runs.find((x) => x.seed === r.seed);
      if (!other || (r.toTarget !== null && other.toTarget !== null)) return [];
      return [{ seed: r.seed, only: r.toTarget !== null ? 'this run' : other.toTarget !== null ? 'the reference' : undefined }];
    });
    const notes = unpaired.map((u) => `; seed ${u.seed}: ${u.only ? `only ${u.only} reached it` : 'neither reached the target'}`).join('');
    if (xs.length < 2) return `- ${what}: not decided (${xs.length} paired seed${xs.length === 1 ? '' : 's'}${notes})`;
    const m = meanInterval(xs);
    let word = m.low >= bound ? 'met' : m.high < bound ? 'not met' : 'undecided';
    if ((word === 'met' && unpaired.some((u) => u.only === 'the reference')) || (word === 'not met' && unpaired.some((u) => u.only === 'this run'))) word = 'undecided';
    return `- ${what}: ${fmt(m.mean, 2)}× (${fmt(m.low, 2)} … ${fmt(m.high, 2)}, ${xs.length} paired seeds${notes}) against ${bound}×: **${word}**`;
  };
  /** The paired difference of final accuracies (points), run − reference, against 0. */
  const accuracyVerdict = (what, run, reference) => {
    const row = rows.find((r) => r.name === run), ref = rows.find((r) => r.name === reference);
    if (!row || !ref) return `- ${what}: not run yet`;
    const xs = row.runs.flatMap((r) => {
      const other = ref.runs.find((x) => x.seed === r.seed);
      return other ? [100 * (r.evaluations.at(-1).quality - other.evaluations.at(-1).quality)] : [];
    });
    if (xs.length < 2) return `- ${what}: not decided (${xs.length} paired seed${xs.length === 1 ? '' : 's'})`;
    const m = meanInterval(xs);
    return `- ${what}: ${fmt(m.mean, 2)} points (${fmt(m.low, 2)} … ${fmt(m.high, 2)}, ${xs.length} seeds): **${m.high < 0 ? 'not met' : 'met'}**`;
  };
  const goals = [
    ...(link === 'slow'
      ? [
          verdict('Accordion (PowerSGD) sooner than DDP with its PowerSGD hook', 'powersgd-accordion', 'ddp-powersgd', 1),
          verdict('Accordion (PowerSGD) at least 1.5× sooner than DDP dense', 'powersgd-accordion', 'ddp', 1.5),
        ]
      : []),
    ...(link === 'drop'
      ? [
          ...['dense', 'follow-low', 'follow-accordion', 'follow-auto-once'].map((reference) => verdict(`re-planning sooner than ${rows.find((r) => r.name === reference)?.title ?? reference}`, 'follow-auto', reference, 1)),
          accuracyVerdict("re-planning's final accuracy within static low's or above (paired difference)", 'follow-auto', 'follow-low'),
        ]
      : [
          verdict('our dense no slower than DDP dense', 'dense', 'ddp', 1),
          verdict('automatic levels at least as soon as Accordion (PowerSGD)', 'powersgd-auto', 'powersgd-accordion', 1),
          verdict('automatic levels at least as soon as Accordion (TopK)', 'topk-auto', 'topk-accordion', 1),
        ]),
  ];
  const titles = { run: 'run', final: 'final accuracy %', toTarget: 's to target', step: 's/step', vsDdp: '× sooner than DDP dense', vsHook: '× sooner than DDP + hook', floats: 'floats/worker' };
  const columns = Object.entries(titles).map(([key, title]) => ({ key, title, ...(key === 'run' ? { align: 'left' } : {}) }));
  const lines = [
    `# Time to accuracy, ${link} link (${o.rate ?? LINKS[link]} a host, ${HOSTS} hosts)${o.quick ? ' — quick mode, not figures to quote' : ''}`,
    '',
    `Runs on ${o.machine}.`,
    '',
    `Target: dense's mean final accuracy less ${MARGIN} points = ${fmt(100 * target, 2)}%. Seeds ${o.seeds.join(', ')}; means with`,
    "Student's 95% intervals; speed-ups paired by seed (a seed counts where both runs reached the target).",
    'Training clock: epochs\' training seconds summed, evaluation and start-up left out on both sides;',
    `${o.evals} evaluation${o.evals > 1 ? 's' : ''} of the test set an epoch, the crossing of a target interpolated between the two around it.`,
    '',
    formatTable(columns, table, { markdown: true }),
    '',
    'Goals (speed-ups as paired ratios of times to the target):',
    '',
    ...goals,
    '',
    `Descriptive only, not for the goals (lower targets, chosen after the runs): mean seconds to ${LOWER.map((d) => `dense − ${d}`).join(', ')} points`,
    '(where fewer seeds than run reached one, how many did).',
    '',
    formatTable(
      [{ key: 'run', title: 'run', align: 'left' }, ...LOWER.map((d) => ({ key: `d${d}`, title: `s to ${fmt(100 * target + MARGIN - d, 2)}%` }))],
      rows.map((row, i) => ({
        run: table[i].run,
        ...Object.fromEntries(LOWER.map((d) => {
          const times = row.runs.map((r) => timeToTarget(r.evaluations, target + (MARGIN - d) / 100)).filter((t) => t !== null);
          return [`d${d}`, times.length ? `${fmt(meanInterval(times).mean, 0)}${times.length < row.runs.length ? ` (${times.length} of ${row.runs.length})` : ''}` : 'not reached'];
        })),
      })),
      { markdown: true },
    ),
    '',
    ...rows.filter((row) => row.name === 'follow-auto').flatMap((row) => [
      `Plans of ${row.title} (levels of the ${Object.values(row.runs[0].plans?.[0]?.levels ?? {}).reduce((a, n) => a + n, 0)} matrices; each check's plan, then each re-plan):`,
      '',
      ...row.runs.flatMap((r) => [`- seed ${r.seed}:`, ...(r.plans ?? []).map((p) => `  - ${showPlan(p)}`)]),
      '',
    ]),
    `Command: \`node bench/time-to-accuracy.js report ${link}${o.evals !== EVALS ? ` --evals ${o.evals}` : ''}${o.quick ? ' --quick' : ''}\``,
  ];
  return lines.join('\n');
}

/** `pilot`: a dense epoch over 4 hosts at each rate; its exchange's seconds against its compute's. */
async function pilot(o) {
  const s = setting('dense', { quick: true, evals: 1 });
  const rows = [];
  for (const rate of o.rates) {
    const run = path.join(o.dir, 'pilot', `dense-${rate}`);
    fs.rmSync(run, { recursive: true, force: true });
    fs.mkdirSync(path.dirname(run), { recursive: true });
    const args = [path.join(ROOT, 'lib', 'cli.js'), 'cluster', '--hosts', String(HOSTS), '--bandwidth', rate, '--', ...engineArgs({ ...s, epochs: 1, trainImages: 12_800 }, 'dense', 1, 'dense'), '--out', run, '--overwrite'];
    const { code } = await runLogged(process.execPath, args, `${run}.log`, { spawn: { env: { ...process.env, OMP_NUM_THREADS: '1' } } });
    if (code !== 0) throw new Error(`pilot at ${rate} failed (exit ${code}): see ${run}.log`);
    const r = readRun(run);
    rows.push({ rate, compute: fmt(r.computePerStep, 3), exchange: fmt(r.communicationPerStep, 3), ratio: fmt(r.communicationPerStep / r.computePerStep, 2) });
  }
  console.log(formatTable([{ key: 'rate', title: 'rate', align: 'left' }, { key: 'compute', title: 'compute s/step' }, { key: 'exchange', title: 'exchange s/step' }, { key: 'ratio', title: 'exchange ÷ compute' }], rows, { markdown: true }));
}

const USAGE = `Usage: sudo node bench/time-to-accuracy.js run LINK-GROUP [options]
       node bench/time-to-accuracy.js report LINK [options]
       sudo node bench/time-to-accuracy.js pilot [--rates R,R]
       node bench/time-to-accuracy.js list
  LINK: ${Object.keys(LINKS).join(', ')}; GROUP: ${Object.keys(GROUPS).join(', ')}
  --seeds LIST      seeds (default 1,2,3)
  --configs LIST    a group's configs (default: all of them)
  --rate RATE       the hosts' egress instead of the link's (a trial)
  --rates LIST      pilot: the rates to try (default ${Object.values(RATES).join(',')})
  --dir DIR         where runs go (default runs/time-to-accuracy)
  --results DIR     where report writes (default bench/results), with each finished run's record
                    (time-to-accuracy/LINK/…/RUN.json), read where the run's folder is gone
  --machine NAME    report the runs kept from that machine (default this one: '${MACHINE}')
  --evals N         test-set evaluations an epoch, the engine and PyTorch alike (default ${EVALS}; runs of
                    another count are kept apart, those of 1 where they always were)
  --quick           2 epochs on 512 images: a smoke run, not figures to quote`;

async function main() {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: {
      seeds: { type: 'string', default: '1,2,3' }, configs: { type: 'string' }, rate: { type: 'string' }, rates: { type: 'string', default: Object.values(RATES).join(',') },
      dir: { type: 'string', default: path.join(ROOT, 'runs', 'time-to-accuracy') }, results: { type: 'string', default: path.join(ROOT, 'bench', 'results') },
      evals: { type: 'string', default: String(EVALS) }, machine: { type: 'string', default: MACHINE }, quick: { type: 'boolean', default: false }, help: { type: 'boolean', default: false },
    },
  });
  const [command, name] = positionals;
  if (values.help || !command) return console.log(USAGE);
  const o = { ...values, seeds: values.seeds.split(',').map(Number), rates: values.rates.split(','), evals: Number(values.evals) };
  if (!Number.isInteger(o.evals) || o.evals < 1) throw new Error(`--evals: a whole number of evaluations an epoch, at least 1; got '${values.evals}'`);
  if (o.rate) parseBandwidth(o.rate);
  o.rates.forEach(parseBandwidth);
  if (command === 'list') {
    for (const link of Object.keys(LINKS)) for (const [group, g] of Object.entries(GROUPS)) console.log(`${link}-${group}  ${LINKS[link]} a host: ${g.configs.join(', ')}`);
    return;
  }
  if ((command === 'run' || command === 'pilot') && missingCapabilities().length) throw new Error(`the simulated cluster needs root (this process lacks ${missingCapabilities().join(' and ')})`);
  if (command === 'pilot') return pilot(o);
  if (command === 'report') {
    if (!LINKS[name]) throw new Error(`report: a link, ${Object.keys(LINKS).join(' or ')}; got '${name}'`);
    const text = report(o, name);
    const file = path.join(o.results, `time-to-accuracy-${name}${o.evals !== EVALS ? `-x${o.evals}` : ''}-${machineSlug(o.machine)}${o.quick ? '-quick' : ''}.md`);
    fs.writeFileSync(file, text + '\n');
    return console.log(`${text}\n\nwritten: ${file}`);
  }
  if (command !== 'run') throw new Error(`unknown command '${command}'\n${USAGE}`);
  const [link, group] = (name ?? '').split('-');
  if (!LINKS[link] || !GROUPS[group]) throw new Error(`run: LINK-GROUP with LINK ${Object.keys(LINKS).join('|')} and GROUP ${Object.keys(GROUPS).join('|')}; got '${name}'`);
  const configs = o.configs ? o.configs.split(',') : GROUPS[group].configs;
  for (const c of configs) if (!GROUPS[group].configs.includes(c)) throw new Error(`--configs: '${c}' is not in ${group} (${GROUPS[group].configs.join(', ')})`);
  const s = setting(group, o);
  console.log(`${name}: ${configs.join(', ')} × seeds ${o.seeds.join(', ')} on ${HOSTS} hosts at ${o.rate ?? LINKS[link]}; runs under ${path.join(o.dir, link, s.tag)}`);
  for (const seed of o.seeds)
    for (const config of configs) console.log(`  ${new Date().toISOString().slice(11, 19)} ${runName(group, config)} seed ${seed}: ${await runOne(o, link, s, group, config, seed)}`);
}

main().catch((e) => {
  console.error(`bench/time-to-accuracy.js: ${e.message}`);
  process.exit(1);
});
