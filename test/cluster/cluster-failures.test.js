// The cluster command when a job goes wrong (needs root and iproute2, as CI has): no CAP_NET_ADMIN, a partition,
// a killed host, signals, and the sweep of a killed command's leftovers, each leaving nothing behind.
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { expect } from 'chai';
import { loadCheckpoint } from '../../lib/index.js';
import * as netns from '../../lib/cluster/netns.js';
import { readNetworkLog } from '../../lib/cluster/cluster.js';
import { waitFor } from '../helpers/processes.js';
import { clusterRuns, expectNothingLeft, finished, processesMentioning, start } from '../helpers/cluster-runs.js';
import { CLI } from '../helpers/paths.js';

function latestOf(dir) {
  const file = path.join(dir, 'checkpoints', 'latest');
  return fs.existsSync(file) ? fs.readFileSync(file, 'utf8').trim() : undefined;
}

describe('accordion cluster (needs root)', function () {
  const { lstm, runDir } = clusterRuns();

  it('without CAP_NET_ADMIN it exits 2 saying it needs root', function () {
    const r = spawnSync('setpriv', ['--bounding-set=-net_admin', '--inh-caps=-net_admin', process.execPath, CLI, 'cluster', '--', ...lstm(8)], { encoding: 'utf8', timeout: 30000 });
    expect(r.error, 'setpriv (util-linux) is needed to drop the capability').to.equal(undefined);
    expect(r.status, r.stderr).to.equal(2);
    expect(r.stderr).to.match(/the cluster command needs root: .*this process lacks CAP_NET_ADMIN/);
  });

  it('a partition of one host ends every worker within --timeout plus a few seconds, naming the operation and the unreachable rank; the last checkpoint resumes in a cluster without it', async function () {
    const timeoutMs = 3000;
    const dir = runDir('partition');
    const args = [...lstm(32), '--workers', '2'];
    const c = start(['cluster', '--bandwidth', '100mbit', '--', ...args, '--epochs', '200', '--timeout', String(timeoutMs), '--out', dir]);
    await waitFor('the first checkpoint', () => {
      if (c.done) throw new Error(`the job ended before its first checkpoint; stderr:\n${c.stderr}`);
      return latestOf(dir);
    }, 60000);
    const network = await netns.findNetwork(c.child.pid);
    expect(network.hosts.map((h) => h.address)).to.deep.equal(['10.87.0.1', '10.87.0.2']);
    await netns.setPartitioned(network, 1, true);
    const cutAt = Date.now();

    const exit = await finished(c, timeoutMs + 30000, 'the partitioned job');
    expect(exit.code, exit.stderr).to.equal(1);
    const operation = '(all-reduce|all-gather|broadcast|barrier)[^:]*';
    const rank0 = c.lines.find((l) => new RegExp(`^accordion: ${operation} failed on rank 0 of 2: rank 1 does not answer`).test(l.text));
    const rank1 = c.lines.find((l) => new RegExp(`^\\[host 1\\] \\[rank 1\\] accordion: ${operation} failed on rank 1 of 2: rank 0 did not answer`).test(l.text));
    expect(rank0, `rank 0's error; stderr:\n${exit.stderr}`).to.not.equal(undefined);
    expect(rank1, `rank 1's error; stderr:\n${exit.stderr}`).to.not.equal(undefined);
    for (const line of [rank0, rank1]) expect(line.at - cutAt, line.text).to.be.below(timeoutMs + 6000);
    expect(exit.stderr).to.match(/^accordion launch: job failed: rank 0 exited with code 1/m);
    expect(exit.stderr).to.match(/^\[host 1\] accordion launch: job failed: rank 1 exited with code 1/m);
    expect(exit.stderr).to.match(/^accordion cluster: job failed: host [01] \(rank [01]\): its launcher exited with code 1/m);
    await expectNothingLeft(c, dir);

    const epochs = loadCheckpoint(dir, 0).position.epochsCompleted;
    for (const rank of [0, 1]) expect(loadCheckpoint(dir, rank).position.epochsCompleted, `rank ${rank}`).to.equal(epochs);
    const resumed = start(['cluster', '--bandwidth', '100mbit', '--', ...args, '--resume', dir, '--epochs', String(epochs + 1)]);
    const done = await finished(resumed, 60000, 'the resumed job');
    expect(done.code, done.stderr).to.equal(0);
    expect(latestOf(dir)).to.equal(`epoch-${String(epochs + 1).padStart(4, '0')}`);
    expect(loadCheckpoint(dir, 0).position.extra.history).to.have.length(epochs + 1);
    // The resumed job's counters follow the earlier ones in the same network.jsonl. The cut job
    // may have logged epoch `epochs + 1` too, when the cut fell between its epoch record and its
    // checkpoint: the resumed job's lines are those from its start lines (one per host) on.
    const log = readNetworkLog(dir);
    const resumedAt = log.findLastIndex((r) => r.event === 'start') - 1;
    expect(log.slice(0, resumedAt).filter((r) => r.event === 'epoch').length, 'the cut job\'s epoch lines').to.be.at.least(2);
    expect(log[resumedAt].event, 'a start line per host').to.equal('start');
    expect(log.slice(resumedAt).filter((r) => r.event === 'epoch' && r.epoch === epochs + 1).map((r) => r.host)).to.deep.equal([0, 1]);
    await expectNothingLeft(resumed, dir);
    this.test.title += ` [rank 0 ended ${rank0.at - cutAt} ms and rank 1 ${rank1.at - cutAt} ms after the cut; resumed at epoch ${epochs + 1}]`;
  });

  it('a killed host (all its processes) ends the job naming the rank, with nothing left running', async function () {
    const dir = runDir('killed');
    const c = start(['cluster', '--bandwidth', '100mbit', '--', ...lstm(32), '--epochs', '200', '--timeout', '5000', '--out', dir]);
    await waitFor('the first checkpoint', () => {
      if (c.done) throw new Error(`the job ended before its first checkpoint; stderr:\n${c.stderr}`);
      return latestOf(dir);
    }, 60000);
    const network = await netns.findNetwork(c.child.pid);
    const killed = await netns.killNamespace(network.hosts[1].namespace);
    expect(killed.length, 'processes of host 1 (its launcher and worker)').to.equal(2);
    const exit = await finished(c, 30000, 'the job with a killed host');
    expect(exit.code, exit.stderr).to.equal(1);
    expect(exit.stderr).to.match(/^accordion cluster: job failed: host 1 \(rank 1\): its launcher was killed by SIGKILL/m);
    expect(exit.stderr).to.match(/^accordion: .* failed on rank 0 of 2: rank 1 does not answer/m);
    await expectNothingLeft(c, dir);
  });

  for (const [signal, code, how] of [['SIGINT', 130, 'Ctrl-C (SIGINT to the process group)'], ['SIGTERM', 143, 'SIGTERM to the cluster command alone']])
    it(`${how} stops every host with status ${code} and removes the namespaces`, async function () {
      const dir = runDir(`signal-${signal}`);
      const c = start(['cluster', '--bandwidth', '100mbit', '--', ...lstm(32), '--epochs', '200', '--out', dir]);
      await waitFor('the first checkpoint', () => {
        if (c.done) throw new Error(`the job ended before its first checkpoint; stderr:\n${c.stderr}`);
        return latestOf(dir);
      }, 60000);
      process.kill(signal === 'SIGINT' ? -c.child.pid : c.child.pid, signal);
      const exit = await finished(c, 40000, `the job after ${signal}`);
      expect(exit.code, exit.stderr).to.equal(code);
      expect(exit.stderr).to.include(`accordion cluster: job failed: interrupted by ${signal}`);
      await expectNothingLeft(c, dir);
      expect(latestOf(dir)).to.match(/^epoch-\d{4}$/);
    });

  it("a cluster command killed with SIGKILL leaves namespaces that the next run sweeps, killing what ran in them", async function () {
    const dir = runDir('sigkill');
    const c = start(['cluster', '--bandwidth', '100mbit', '--', ...lstm(32), '--epochs', '200', '--out', dir]);
    await waitFor('the first checkpoint', () => {
      if (c.done) throw new Error(`the job ended before its first checkpoint; stderr:\n${c.stderr}`);
      return latestOf(dir);
    }, 60000);
    const network = await netns.findNetwork(c.child.pid);
    process.kill(c.child.pid, 'SIGKILL');
    await finished(c, 10000, 'the killed command');
    expect(await netns.listClusterNamespaces(), 'the killed run leaves its namespaces').to.include.members([network.switchNamespace, network.hosts[1].namespace]);
    expect(processesMentioning(dir).length, 'the killed run leaves its launchers and workers running').to.be.above(0);

    const next = runDir('after-sigkill');
    const n = start(['cluster', '--bandwidth', '100mbit', '--', ...lstm(8), '--epochs', '1', '--out', next]);
    const exit = await finished(n, 60000, 'the next run');
    expect(exit.code, exit.stderr).to.equal(0);
    expect(exit.stderr).to.match(new RegExp(`removed the namespaces of 1 earlier run\\(s\\) whose process is gone \\(${network.id}\\)`));
    expect((await netns.listClusterNamespaces()).filter((name) => name.startsWith(`${network.id}-`))).to.deep.equal([]);
    expect(processesMentioning(dir), 'processes of the killed run').to.deep.equal([]);
    await expectNothingLeft(n, next);
  });
});
