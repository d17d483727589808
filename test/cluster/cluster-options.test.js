// The cluster command's options: a malformed one is refused with exit 2 and a message naming it (no root needed).
import { spawnSync } from 'node:child_process';
import { expect } from 'chai';
import { CLI } from '../helpers/paths.js';

describe('accordion cluster: options', function () {
  function run(args) {
    const r = spawnSync(process.execPath, [CLI, 'cluster', ...args], { encoding: 'utf8', timeout: 30000 });
    return { code: r.status, stderr: r.stderr };
  }
  const train = ['--', '--model', 'lstm'];
  const cases = [
    [['--bandwidth', '100mbps', ...train], /option --bandwidth: expected a rate such as 100mbit.*got '100mbps'.*bytes per second/],
    [['--bandwidth', 'fast', ...train], /option --bandwidth: expected a rate/],
    [['--bandwidth', '10bit', ...train], /option --bandwidth: at least 1kbit/],
    [['--latency', '5', ...train], /option --latency: expected a delay such as 1ms.*got '5'/],
    [['--latency', '11s', ...train], /option --latency: at most 10s/],
    [['--loss', '1', ...train], /option --loss: expected a percentage such as 1%/],
    [['--loss', '100%', ...train], /option --loss: must be below 100%/],
    [['--burst', '0ms', ...train], /option --burst: expected a time above 0 such as 2ms or 50ms.*got '0ms'/],
    [['--burst', '20s', ...train], /option --burst: at most 10s, got '20s'/],
    [['--bandwidth', '5s:1gbit,10s:100mbit', ...train], /option --bandwidth: a schedule starts at 0s/],
    [['--bandwidth', '0s:1gbit,2s:100mbit,2s:1gbit', ...train], /option --bandwidth: the schedule's times must increase/],
    [['--bandwidth', '0s:1gbit,soon:100mbit', ...train], /option --bandwidth: expected a rate, or TIME:RATE pairs such as 0s:1gbit,120s:100mbit.*got 'soon:100mbit'/],
    [['--bandwidth', '0s:1gbit,5s:100mbps', ...train], /option --bandwidth: expected a rate such as 100mbit.*got '100mbps'/],
    [['--host-bandwidth', '2:100mbit', ...train], /option --host-bandwidth: host 2 is not one of the 2 hosts \(0 to 1\)/],
    [['--host-bandwidth', '1:100mbit,1:10mbit', ...train], /option --host-bandwidth: host 1 is given twice/],
    [['--host-bandwidth', '1:fast', ...train], /option --host-bandwidth: expected a rate such as 100mbit/],
    [['--host-bandwidth', 'slow', ...train], /option --host-bandwidth: expected HOST:RATE pairs such as 1:100mbit, got 'slow'/],
    [['--subnet', '10.87.0.5/24', ...train], /option --subnet: 10.87.0.5\/24 is not a network address \(did you mean 10.87.0.0\/24\?\)/],
    [['--subnet', '10.87.0.0/31', ...train], /option --subnet: expected an IPv4 subnet/],
    [['--hosts', '7', '--subnet', '10.87.0.0/29', ...train], /option --subnet: 10.87.0.0\/29 has room for 6 hosts, not 7/],
    [['--hosts', '0', ...train], /option --hosts: expected an integer from 1/],
    [['--nproc-per-host', 'two', ...train], /option --nproc-per-host: expected an integer/],
    [['--workers', '2', ...train], /unknown cluster option --workers \(training options go after --/],
    [['--hosts', '2'], /accordion cluster needs training options after --/],
    [['--', '--model', 'lstm', '--bogus'], /unknown option --bogus/],
    [['--', '--epochs', '1'], /option --model is required/],
  ];
  for (const [args, pattern] of cases)
    it(`refuses ${args.join(' ')} with exit 2`, function () {
      const r = run(args);
      expect(r.code, r.stderr).to.equal(2);
      expect(r.stderr).to.match(pattern);
    });
});
