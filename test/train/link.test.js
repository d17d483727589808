// The link estimate from the exchange's own collectives (ts/train/link.ts), against hand-computed
// cases: collectives of a known latency and bandwidth, some of them waiting for a late peer, some
// let through by a burst at the start of each step.
import { expect } from 'chai';
import { LinkMonitor, PROBE_FLOATS, ProbeSchedule, collectiveSamples, describeLink, estimateLink } from '../../lib/train/link.js';

describe('the link estimate', function () {
  // A link of 1 ms latency and 10 MB/s: a collective sending b bytes takes 0.001 + b / 1e7 s when
  // nobody waits.
  const took = (bytes, wait = 0) => ({ bytes, seconds: 0.001 + bytes / 1e7 + wait });

  it('separates the latency, the bandwidth and the waiting for a late peer', function () {
    // Four agreements of 8 bytes (two of them waited), three transfers (the last waited 0.2 s).
    const agreements = [0.001, 0.001, 0.0012, 0.005].map((seconds) => ({ bytes: 8, seconds }));
    const samples = [...agreements, took(1e6), took(2e6), took(1e6, 0.2)];
    const link = estimateLink([samples]);
    // Latency: the lower quartile of the agreements' 1, 1, 1.2 and 5 ms.
    expect(link.latencySeconds).to.be.closeTo(0.001, 1e-12);
    // Rates beyond the latency: 1e7, 1e7 and 1e6 / 0.3 B/s; weighted by bytes (1, 2, 1 MB) the
    // 80th percentile is 1e7.
    expect(link.bytesPerSecond).to.be.closeTo(1e7, 1e-3);
    // Waiting: what each exceeds 1 ms + bytes / 1e7 by: 0.2 s, and the agreements' 3.9992 and 0.1992 ms.
    expect(link.waitSeconds).to.be.closeTo(0.2 + 0.0039992 + 0.0001992, 1e-9);
    const total = samples.reduce((a, s) => a + s.seconds, 0);
    expect(link.transferSeconds).to.be.closeTo(total - link.waitSeconds, 1e-12);
    expect(link.collectives).to.equal(7);
    expect(link.burstBytes).to.equal(0);
    expect(describeLink(link)).to.equal('80 Mbit/s, 1.00 ms');
  });

  it('times the rate by transfers of 64 KiB or more that took at least a latency (a compressed exchange on a fast link has none)', function () {
    // 100 kB at 1 GB/s: 0.1 ms beside a latency of 1 ms; 4 kB, which a link's buffers let through at once.
    const link = estimateLink([[{ bytes: 8, seconds: 0.001 }, { bytes: 1e5, seconds: 0.0011 }, took(4000), { bytes: 8, seconds: 0.001 }]]);
    expect(link.bytesPerSecond).to.equal(undefined);
    // The same 100 kB at 10 MB/s are timed.
    expect(estimateLink([[{ bytes: 8, seconds: 0.001 }, took(1e5)]]).bytesPerSecond).to.be.closeTo(1e7, 1e-3);
  });

  it('has no bandwidth without a transfer to time, and nothing without collectives', function () {
    const link = estimateLink([[{ bytes: 8, seconds: 0.001 }, { bytes: 16, seconds: 0.011 }]]);
    expect(link.bytesPerSecond).to.equal(undefined);
    expect(link.latencySeconds).to.be.closeTo(0.001, 1e-12);
    expect(link.waitSeconds).to.be.closeTo(0.01, 1e-12);
    expect(describeLink(link)).to.equal('rate unknown, 1.00 ms');
    expect(estimateLink([])).to.equal(undefined);
  });

  // A token bucket of 300 kB in front of a 10 MB/s link, full at each step's start (the step's
  // compute refills it): what a step sends within its first 300 kB passes at 1 GB/s, the rest at
  // 10 MB/s. Each step: the agreement, then four transfers of 200 kB.
  const bucketed = (burst, wait = () => 0) => {
    let sent = 0;
    const transfer = (bytes, w) => {
      const inBurst = Math.max(0, Math.min(sent + bytes, burst) - sent);
      sent += bytes;
      return { bytes, seconds: 0.001 + inBurst / 1e9 + (bytes - inBurst) / 1e7 + w };
    };
    return [transfer(8, 0), ...[0, 1, 2, 3].map((i) => transfer(2e5, wait(i)))];
  };

  it('fits the burst a step sends at once and times the rate beyond it', function () {
    const steps = Array.from({ length: 5 }, () => bucketed(3e5));
    // Each transfer alone: 200 kB in 0.2 ms, in 10.1 ms and twice in 20 ms; their bytes-weighted
    // rates put the 80th percentile at 19.8 MB/s, twice the link's.
    const link = estimateLink(steps);
    expect(link.bytesPerSecond).to.be.closeTo(1e7, 10); // the latency read includes the agreement's 8 ns
    // The burst: 300 kB less what the 0.3 ms spent on the burst's bytes would have sent at the rate.
    expect(link.burstBytes).to.be.closeTo(297000, 10);
    expect(describeLink(link)).to.equal('80 Mbit/s after 297 kB, 1.00 ms');
    // Nothing waited; the model puts the burst's 0.2 ms into the second transfer, which took 0.1 ms
    // less than it predicts: the first transfer's 0.2 ms read as waiting.
    expect(link.waitSeconds).to.be.closeTo(5 * 0.0002, 1e-5);
    // Without a bucket the same steps give the link's rate and no burst.
    const plain = estimateLink(Array.from({ length: 5 }, () => bucketed(0)));
    expect(plain.bytesPerSecond).to.be.closeTo(1e7, 500); // the agreement's 0.8 µs at 10 MB/s read as latency
    expect(plain.burstBytes).to.equal(0);
  });

  it('keeps the burst and the rate when a late peer makes some transfers wait', function () {
    // In every other step of 8 one transfer waits 5 to 20 ms for a peer.
    const steps = Array.from({ length: 8 }, (_, s) => bucketed(3e5, (i) => (s % 2 && i === s % 4 ? 0.0025 * (s + 1) : 0)));
    const link = estimateLink(steps);
    expect(link.bytesPerSecond).to.be.closeTo(1e7, 10);
    expect(link.burstBytes).to.be.closeTo(297000, 10);
    expect(link.waitSeconds).to.be.closeTo(0.0025 * (2 + 4 + 6 + 8) + 8 * 0.0002, 5e-4);
  });

  it('has no rate when every step fits in the burst', function () {
    // Two transfers of 100 kB a step, under a bucket of 300 kB: nothing times the link.
    const steps = Array.from({ length: 4 }, () => [{ bytes: 8, seconds: 0.001 }, { bytes: 1e5, seconds: 0.001 + 1e5 / 1e9 }, { bytes: 1e5, seconds: 0.001 + 1e5 / 1e9 }]);
    expect(estimateLink(steps).bytesPerSecond).to.equal(undefined);
  });

  it('reads the step results\' pairs of bytes and seconds', function () {
    expect(collectiveSamples(Float64Array.of(8, 0.5, 1e6, 2))).to.deep.equal([
      { bytes: 8, seconds: 0.5 },
      { bytes: 1e6, seconds: 2 },
    ]);
  });

  it('follows a change of the link within its window of steps', function () {
    const monitor = new LinkMonitor(4);
    const step = (bandwidth) => [{ bytes: 8, seconds: 0.001 }, { bytes: 4e6, seconds: 0.001 + 4e6 / bandwidth }];
    for (let s = 0; s < 6; s++) expect(monitor.addStep(step(1e8)).bytesPerSecond).to.be.closeTo(1e8, 1);
    // The link drops tenfold: the window still holds faster steps for a while, then only slow ones.
    const seen = [];
    for (let s = 0; s < 4; s++) seen.push(monitor.addStep(step(1e7)).bytesPerSecond);
    expect(seen[0]).to.be.closeTo(1e8, 1);
    expect(seen[3]).to.be.closeTo(1e7, 1);
  });
});

describe('the probes of the link', function () {
  /**
   * Two ranks in one process: an all-reduce sums both ranks' buffers once both have called it and
   * returns after `seconds` (the link's time for it).
   */
  function pairedGroups(seconds) {
    let waiting;
    const allReduce = (buffer) => new Promise((resolve) => {
      if (!waiting) {
        waiting = { buffer, resolve };
        return;
      }
      const other = waiting;
      waiting = undefined;
      for (let i = 0; i < buffer.length; i++) buffer[i] = other.buffer[i] += buffer[i];
      setTimeout(() => {
        other.resolve();
        resolve();
      }, 1000 * seconds);
    });
    return [0, 1].map((rank) => ({ rank, worldSize: 2, allReduce }));
  }
  const unmeasured = [{ bytes: 8, seconds: 0.001 }, { bytes: 1e5, seconds: 0.01 }];
  const measured = [{ bytes: 1e5, seconds: 0.01 }, { bytes: 1e5, seconds: 0.01 }];

  it('probes a step whose exchange cannot time the link, first after 10 steps', function () {
    const schedule = new ProbeSchedule(30); // a run resumed after 30 steps
    expect(schedule.due(39, unmeasured)).to.equal(false);
    expect(schedule.due(40, unmeasured)).to.equal(true);
    expect(schedule.due(40, measured), 'two collectives of 64 KiB time the link themselves').to.equal(false);
    expect(schedule.interval(), 'nothing to price the next probe on yet').to.equal(10);
  });

  it("spaces the probes to about 5% of the training time, on rank 0's seconds, and every rank probes at the same step", async function () {
    const groups = pairedGroups(0.1);
    const schedules = [new ProbeSchedule(0), new ProbeSchedule(0)];
    const probeBoth = (runStep) => Promise.all(schedules.map((s, r) => s.probe(groups[r], runStep)));
    // Rank 0's steps take 10 ms, rank 1's 30 ms (its seconds are never used).
    const steps = (n) => {
      for (let i = 0; i < n; i++) [0.01, 0.03].forEach((seconds, r) => schedules[r].addStep(seconds));
    };
    steps(10);
    const first = await probeBoth(10);
    expect(first.map((p) => p.nextStep), 'the first probe prices nothing').to.deep.equal([20, 20]);
    for (const p of first) {
      expect(p.samples.map((c) => c.bytes)).to.deep.equal([4 * PROBE_FLOATS, 4 * PROBE_FLOATS]); // 2(W − 1)/W of 1 MiB
      expect(p.allReducedFloats).to.equal(2 * PROBE_FLOATS);
      expect(p.seconds).to.be.within(0.19, 0.4);
    }
    steps(10);
    // By hand: the first probe's 0.2 s over 5% of rank 0's 10 ms steps is 400 steps.
    const expected = Math.ceil(first[0].seconds / (0.05 * 0.01));
    expect(expected).to.be.within(380, 800);
    expect(schedules[0].interval()).to.equal(expected);
    const second = await probeBoth(20);
    expect(second.map((p) => p.nextStep)).to.deep.equal([20 + expected, 20 + expected]);
    for (const probes of [first, second]) probes.forEach((p, r) => expect(p.stepSeconds, `rank ${r}'s mean step since the last probe`).to.be.closeTo([0.01, 0.03][r], 1e-12));
    expect(schedules[1].due(20 + expected - 1, unmeasured)).to.equal(false);
    expect(schedules[1].due(20 + expected, unmeasured)).to.equal(true);
  });

  it('probes at least every 10 steps apart however cheap the probe', async function () {
    const groups = pairedGroups(0);
    const schedules = [new ProbeSchedule(0), new ProbeSchedule(0)];
    for (const runStep of [10, 20]) {
      for (const s of schedules) for (let i = 0; i < 10; i++) s.addStep(1);
      const probes = await Promise.all(schedules.map((s, r) => s.probe(groups[r], runStep)));
      expect(probes.map((p) => p.nextStep)).to.deep.equal([runStep + 10, runStep + 10]);
    }
  });
});
