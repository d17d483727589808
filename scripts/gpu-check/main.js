#!/usr/bin/env node
// The GPU verification, as stages that each fit one command on a GPU machine (scripts/gpu-check/plan.js).
// On the GPU machine it runs under scripts/gpu-check/run.sh, which unpacks the runtime it needs;
// `plan` and `summary` run wherever Node does.
//
//   plan                 the GPU-machine commands in order, with the minutes each is expected to take
//   STAGE                one stage under its own limit: probe, abi-lab, sanitizer, suite, bench-quick,
//                        bench-full, peers, precision, reproduce or prebuilt (experiments: plan lists them apart), or rebuild (only
//                        when the probe says the carried build does not load)
//   summary FILE...      what gpu-check.jsonl files say, stage by stage
//   exec COMMAND...      COMMAND in the runtime's environment (the libraries found as the stages
//                        find them), its output to the log: for a diagnosis
//
// Results: every stage appends to $OUT/gpu-check.jsonl (./gpu-check-out without $OUT) one JSON
// object a row, beginning with {"event": "begin"} and ending with {"event": "end", "status",
// "exitCode", "seconds"}, and its output to $OUT/gpu-check.log.
// Exit status: 0 passed; 1 failed; 2 bad usage; 3 no usable device; 5 not run, as the machine does
// not support it; 6 no runtime to run with; 124 the stage ran past its limit.
import * as os from 'node:os';
import * as path from 'node:path';
import { Output } from './output.js';
import { limitOf, planText } from './plan.js';
import { REPO, libraries } from './machine.js';
import { abiLab, bench, probe, rebuildStage, sanitizer, suite } from './stages.js';
import { peers, precision, prebuilt, reproduce } from './experiments.js';
import { summary } from './summary.js';

const STAGES = {
  probe, 'abi-lab': abiLab, sanitizer, suite, 'bench-quick': (o, l) => bench(o, l, 'quick'), 'bench-full': (o, l) => bench(o, l, 'full'), peers, precision, reproduce, prebuilt, rebuild: rebuildStage,
};
const VERDICTS = { 0: 'passed', 3: 'no device', 5: 'not run: not supported on this machine', 6: 'no runtime', 124: null };
const USAGE = `usage: node scripts/gpu-check/main.js plan | ${Object.keys(STAGES).join(' | ')} | summary FILE... | exec COMMAND...`;
const outDir = () => process.env.OUT || path.join(REPO, 'gpu-check-out');

/** One stage under its limit, between a begin and an end row; resolves to its exit status. */
async function runStage(name) {
  const out = new Output(outDir(), name);
  const limit = limitOf(name);
  const started = Date.now();
  out.row({ event: 'begin', limit, host: os.hostname(), checkout: REPO });
  out.say(`== gpu-check ${name} ${new Date().toISOString().replace(/\.\d+Z$/, 'Z')} (timeout ${limit} s; results in ${out.results})`);
  // The stage's own work ends 10 s before its limit; past the limit, what still runs is killed.
  const left = () => limit - 10 - (Date.now() - started) / 1000;
  let timer;
  const overrun = new Promise((resolve) => (timer = setTimeout(() => resolve(124), limit * 1000)));
  const status = await Promise.race([STAGES[name](out, left).catch((e) => (out.say(`gpu-check: ${name}: ${e.stack ?? e}`), 1)), overrun]);
  clearTimeout(timer);
  out.killAll();
  const seconds = Math.round((Date.now() - started) / 1000);
  const verdict = status in VERDICTS ? VERDICTS[status] ?? `timed out after ${limit} s` : 'failed';
  out.row({ event: 'end', status: verdict, exitCode: status, seconds });
  out.say(`gpu-check: ${name} ${verdict} (exit ${status}, ${seconds} s)`);
  return status;
}

async function main(argv) {
  const [command = 'plan', ...rest] = argv;
  if (command === 'plan') return console.log(planText()), 0;
  if (command === 'summary') {
    if (!rest.length) return console.error(USAGE), 2;
    return console.log(summary(rest)), 0;
  }
  if (command === 'exec') {
    if (!rest.length) return console.error(USAGE), 2;
    const out = new Output(outDir(), 'exec');
    libraries();
    out.say(`== exec: ${rest.join(' ')}`);
    return (await out.run(rest[0], rest.slice(1), { seconds: 600, cap: 100_000 })).status;
  }
  if (!STAGES[command]) return console.error(USAGE), 2;
  return runStage(command);
}

main(process.argv.slice(2)).then((code) => process.exit(code));
