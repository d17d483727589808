// What the suites of the cluster command (test/cluster/cluster-*.test.js) share: the CLI started in a process
// group of its own, a suite's corpus and run directories, and the check that a cluster left nothing behind.
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { expect } from 'chai';
import * as netns from '../../lib/cluster/netns.js';
import { exitWithin, startNode } from './processes.js';
import { CLI } from './paths.js';

// ---------------------------------------------------------------------------------------------
// Processes: whatever a test starts is killed after it, with its cluster's namespaces.

const live = new Set();

/** Starts the CLI in its own process group (startNode); its stderr lines are also kept, in `lines`, with the time they arrived. */
export function start(args, env = {}) {
  const entry = startNode(live, [CLI, ...args], env, { detached: true });
  entry.lines = [];
  let pending = '';
  entry.child.stderr.on('data', (s) => {
    const parts = (pending + s).split('\n');
    pending = parts.pop();
    for (const text of parts) entry.lines.push({ at: Date.now(), text });
  });
  return entry;
}

export async function finished(entry, ms, what) {
  const exit = await exitWithin(entry, ms);
  expect(exit.timedOut, `${what} did not end within ${ms} ms; stderr:\n${entry.stderr}`).to.not.equal(true);
  return exit;
}

/** Live processes whose command line mentions `text` (each test's run directory is unique). */
export function processesMentioning(text) {
  const found = [];
  for (const name of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(name) || Number(name) === process.pid) continue;
    try {
      const cmdline = fs.readFileSync(`/proc/${name}/cmdline`, 'utf8');
      const stat = fs.readFileSync(`/proc/${name}/stat`, 'utf8');
      if (stat.slice(stat.lastIndexOf(')') + 2)[0] === 'Z') continue;
      if (cmdline.includes(text)) found.push(`${name}: ${cmdline.replace(/\0/g, ' ').slice(0, 200)}`);
    } catch {
      // gone meanwhile
    }
  }
  return found;
}

function rootVeths() {
  const r = spawnSync('ip', ['-j', 'link', 'show', 'type', 'veth'], { encoding: 'utf8' });
  return JSON.parse(r.stdout || '[]').map((l) => l.ifname).sort();
}

function rootQdiscs() {
  return spawnSync('tc', ['qdisc', 'show'], { encoding: 'utf8' }).stdout;
}

const baseline = {};

/** Nothing of the cluster started as `entry` remains: no namespace, veth, qdisc or process. */
export async function expectNothingLeft(entry, runDir) {
  const names = (await netns.listClusterNamespaces()).filter((n) => n.startsWith(`acc-${entry.child.pid}-`));
  expect(names, 'namespaces of the run left behind').to.deep.equal([]);
  expect(rootVeths(), 'veth devices in the machine namespace').to.deep.equal(baseline.veths);
  expect(rootQdiscs(), 'qdiscs of the machine namespace').to.equal(baseline.qdiscs);
  expect(processesMentioning(runDir), 'processes of the run left running').to.deep.equal([]);
}

/** Kills what the test left running; the namespaces of a cluster killed here are swept. */
async function killLeftovers() {
  for (const entry of live) {
    try {
      process.kill(-entry.child.pid, 'SIGKILL');
    } catch {
      // already gone
    }
  }
  await Promise.all([...live].map((e) => exitWithin(e, 5000)));
  await netns.sweepStale();
}

// ---------------------------------------------------------------------------------------------
// Data: a tiny WikiText-like corpus, so that a 2-host LSTM job takes a few seconds.

function writeCorpus(dir, lines) {
  fs.mkdirSync(dir, { recursive: true });
  let s = 12345;
  const next = () => (s = (Math.imul(s, 1664525) + 1013904223) >>> 0);
  const text = (n) => Array.from({ length: n }, () => Array.from({ length: 20 }, () => `w${next() % 200}`).join(' ')).join('\n') + '\n';
  fs.writeFileSync(path.join(dir, 'wiki.train.tokens'), text(lines));
  fs.writeFileSync(path.join(dir, 'wiki.valid.tokens'), text(40));
  fs.writeFileSync(path.join(dir, 'wiki.test.tokens'), text(40));
}

/**
 * In a suite's body: before it, a check for root and iproute2 (failing, saying so, without them), a
 * temporary directory with a small corpus, and the machine's veths and qdiscs as the baseline of
 * expectNothingLeft; after each test, what it left running killed and its namespaces swept; after the
 * suite, the directory removed. Returns lstm(hidden), the options of an LSTM job on the corpus, and
 * runDir(name), a directory for one run.
 */
export function clusterRuns() {
  let tmp, data;
  const lstm = (hidden) => ['--model', 'lstm', '--data', data, '--hidden', String(hidden), '--seed', '7', '--quiet'];
  const runDir = (name) => path.join(tmp, name);

  before(async function () {
    const missing = netns.missingCapabilities();
    if (missing.length)
      throw new Error(`these tests need root: they create network namespaces, veth pairs, a bridge and qdiscs (this process lacks ${missing.join(' and ')}); run them as root, as CI does`);
    if (spawnSync('ip', ['-V']).error || spawnSync('tc', ['-V']).error) throw new Error('these tests need iproute2 (ip and tc): apt-get install iproute2');
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'acc-cluster-'));
    data = path.join(tmp, 'wikitext');
    writeCorpus(data, 800);
    await netns.sweepStale();
    baseline.veths = rootVeths();
    baseline.qdiscs = rootQdiscs();
  });

  afterEach(killLeftovers);
  after(() => tmp && fs.rmSync(tmp, { recursive: true, force: true }));

  return { lstm, runDir };
}
