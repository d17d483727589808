#!/usr/bin/env node
// Entry of `npm run bench`: runs every suite in order, each in its own process.
//
//   npm run bench [-- --quick] [-- --only step[,other]]
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { BENCH_DIR, ROOT } from './common.js';

// New suites (compression kernels with tinybench, collectives) are appended here. `quick` holds
// the arguments that shrink a suite to a smoke run.
const SUITES = [
  {
    name: 'step',
    script: 'step.js',
    description: 'training step, engine vs PyTorch',
    args: [],
    quick: ['--warmup', '1', '--steps', '3', '--rounds', '1'],
  },
  {
    name: 'compression',
    script: 'compression.js',
    description: 'PowerSGD, TopK, Gram-Schmidt and norm bookkeeping, engine (tinybench) vs PyTorch',
    args: [],
    quick: ['--quick'],
  },
  {
    name: 'collectives',
    script: 'collectives.js',
    description: 'all-reduce and all-gather across 2 and 4 processes, engine vs torch.distributed Gloo',
    args: [],
    quick: ['--quick'],
  },
  {
    name: 'lstm',
    script: 'lstm.js',
    description: 'LSTM language-model training step (2×650, V 33,278, BPTT 35, batch 20), engine vs PyTorch',
    args: [],
    quick: ['--quick'],
  },
  {
    // Root and about an hour: run only when named (--only cluster).
    name: 'cluster',
    script: 'cluster.js',
    description: 'ResNet-18 over 2 simulated hosts at 10 Gbit/s, 1 Gbit/s and 100 Mbit/s: s/step and time to accuracy per exchange (root)',
    args: [],
    quick: ['--quick', '--bandwidths', '1gbit', '--configs', 'dense,powersgd-r1'],
    onlyWhenNamed: true,
  },
  {
    // Root and about half an hour: run only when named (--only overlap).
    name: 'overlap',
    script: 'overlap.js',
    description: 'ResNet-18 over 2 simulated hosts: the exchange overlapped with backward against after it, and PyTorch DDP (root)',
    args: [],
    quick: ['--bandwidths', '1gbit'],
    onlyWhenNamed: true,
  },
  {
    name: 'event-loop',
    script: 'event-loop.js',
    description: 'event-loop delay while ResNet-18 trains and writes a checkpoint every epoch (synthetic preset)',
    args: [],
    quick: ['--quick'],
  },
];

const USAGE = `usage: node bench/run.js [--quick] [--only NAME[,NAME]]
  --quick      fewer steps: a smoke run, not figures to quote
  --only LIST  run only these suites (${SUITES.map((s) => s.name).join(', ')}; cluster and overlap run only when named)`;

// A separate process per suite so one suite's native thread pools and memory cannot colour the next.
function runSuite(suite, quick) {
  const args = [join(BENCH_DIR, suite.script), ...suite.args, ...(quick ? suite.quick : [])];
  console.log(`\n== ${suite.name}: ${suite.description}\n$ node ${['bench/' + suite.script, ...args.slice(1)].join(' ')}`);
  return new Promise((resolve) => {
    const child = spawn(process.execPath, args, { cwd: ROOT, stdio: 'inherit' });
    child.on('error', (err) => resolve({ code: 1, error: err.message }));
    child.on('exit', (code, signal) => resolve({ code: code ?? 1, signal }));
  });
}

async function main() {
  let values;
  try {
    ({ values } = parseArgs({
      args: process.argv.slice(2),
      options: {
        quick: { type: 'boolean', default: false },
        only: { type: 'string' },
        help: { type: 'boolean', short: 'h', default: false },
      },
    }));
  } catch (err) {
    console.error(`bench/run.js: ${err.message}\n${USAGE}`);
    return 2;
  }
  if (values.help) {
    console.log(USAGE);
    return 0;
  }
  let suites = SUITES.filter((s) => !s.onlyWhenNamed);
  if (values.only !== undefined) {
    const wanted = values.only.split(',').map((s) => s.trim()).filter(Boolean);
    const unknown = wanted.filter((w) => !SUITES.some((s) => s.name === w));
    if (unknown.length || wanted.length === 0) {
      console.error(`bench/run.js: unknown suite(s) '${unknown.join(', ') || values.only}'\n${USAGE}`);
      return 2;
    }
    suites = SUITES.filter((s) => wanted.includes(s.name));
  }

  const failed = [];
  for (const suite of suites) {
    const { code, signal, error } = await runSuite(suite, values.quick);
    if (code !== 0) failed.push(`${suite.name} (${error ?? signal ?? `exit ${code}`})`);
  }
  if (failed.length) {
    console.error(`\nbench: failed: ${failed.join(', ')}`);
    return 1;
  }
  console.log(`\nbench: ${suites.length} suite(s) done${values.quick ? ' (quick: smoke figures only)' : ''}`);
  return 0;
}

main().then((code) => process.exit(code));
