// `accordion plan`: the α-β models of the collectives and of a step against hand-computed cases,
// and the command's options and outputs.
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { expect } from 'chai';
import { allGatherSeconds, allReduceSeconds, broadcastSeconds, bucketTraffic, predictStep } from '../../lib/cluster/predict.js';
import { compressionSpec } from '../../lib/config/compression.js';
import { DEFAULT_CONFIG } from '../../lib/config/options.js';
import { ReducerProbe } from '../../lib/testing.js';
import { CLI } from '../helpers/paths.js';

const link = { bytesPerSecond: 1e6, latencySeconds: 1e-3 };
const spec = (compressor) => compressionSpec({ ...DEFAULT_CONFIG, compressor });

describe('accordion plan', function () {
  describe('the α-β models', function () {
    it('prices each collective by its algorithm', function () {
      // Two workers swap their buffers: α + B/β.
      expect(allReduceSeconds(2e6, 2, link, 'ring')).to.be.closeTo(0.001 + 2, 1e-12);
      expect(allReduceSeconds(2e6, 2, link, 'tree')).to.be.closeTo(0.001 + 2, 1e-12);
      // A ring of 4: 2·3 latencies, 2·3/4 of the buffer.
      expect(allReduceSeconds(2e6, 4, link, 'ring')).to.be.closeTo(0.006 + 3, 1e-12);
      // A tree of 8: 2·3 latencies, twice the buffer; of 5: ⌈log₂ 5⌉ = 3 rounds.
      expect(allReduceSeconds(2e6, 8, link, 'tree')).to.be.closeTo(0.006 + 4, 1e-12);
      expect(allReduceSeconds(2e6, 5, link, 'tree')).to.be.closeTo(0.006 + 4, 1e-12);
      // All-gather of 1 MB from each of 4: 3 hops of a latency and a megabyte.
      expect(allGatherSeconds(1e6, 4, link)).to.be.closeTo(3 * 1.001, 1e-12);
      // Broadcast to 5: 3 rounds.
      expect(broadcastSeconds(1e6, 5, link)).to.be.closeTo(3 * 1.001, 1e-12);
      // Nothing travels among one worker or for no bytes.
      expect(allReduceSeconds(2e6, 1, link, 'ring')).to.equal(0);
      expect(allGatherSeconds(0, 4, link)).to.equal(0);
    });

    it('buckets the exchange as the engine does and sends each tensor by its level', function () {
      const shapes = [[4, 3], [4], [10, 20]];
      // PowerSGD rank 2: [10, 20] sends P 10·2 and Q 20·2 floats ((10 + 20)·2 < 200); [4, 3] stays dense ((4 + 3)·2 ≥ 12).
      expect(bucketTraffic({ shapes, spec: spec('powersgd'), level: 2, commDtype: 'fp32', bucketBytes: 0 })).to.deep.equal([{ dense: 16 + 48, powerSgdP: 80, powerSgdQ: 160, topkPairs: 0, denseBf16: 0 }]);
      // Buckets of 100 bytes, in reverse order: [10, 20] (800 bytes) fills the first; [4] and [4, 3] the second.
      expect(bucketTraffic({ shapes, spec: spec('powersgd'), level: 2, commDtype: 'bf16', bucketBytes: 100 })).to.deep.equal([
        { dense: 0, powerSgdP: 40, powerSgdQ: 80, topkPairs: 0, denseBf16: 0 },
        { dense: 8 + 24, powerSgdP: 0, powerSgdQ: 0, topkPairs: 0, denseBf16: 0 },
      ]);
      // TopK 10%: ⌊0.1·200⌋ = 20 and ⌊0.1·12⌋ = 1 pairs of 4 + 4 bytes; the bias dense; dense: everything.
      expect(bucketTraffic({ shapes, spec: spec('topk'), level: 0.1, commDtype: 'fp32', bucketBytes: 0 })).to.deep.equal([{ dense: 16, powerSgdP: 0, powerSgdQ: 0, topkPairs: 168, denseBf16: 0 }]);
      expect(bucketTraffic({ shapes, spec: spec('powersgd'), level: 0, commDtype: 'fp32', bucketBytes: 0 })).to.deep.equal([{ dense: 864, powerSgdP: 0, powerSgdQ: 0, topkPairs: 0, denseBf16: 0 }]);
      // Dense in bf16: the matrices' 212 values at 2 bytes, the bias in the exchange's fp32.
      expect(bucketTraffic({ shapes, spec: spec('powersgd'), level: -1, commDtype: 'fp32', bucketBytes: 0 })).to.deep.equal([{ dense: 16, powerSgdP: 0, powerSgdQ: 0, topkPairs: 0, denseBf16: 424 }]);
    });

    it("predicts every collective the engine's exchange runs, at each bucket size and level", function () {
      // The plan's traffic and the exchange come from the same rules: change a bucket size, a level or
      // a compressor and the collectives of 4 in-process workers follow the prediction, one by one.
      const shapes = [[6, 5], [6], [40, 30], [40], [10, 40], [3, 3, 3, 3]];
      const W = 4, allReduce = (b) => (b * 2 * (W - 1)) / W, allGather = (b) => b * (W - 1);
      let cases = 0;
      for (const [compressor, level] of [['powersgd', 2], ['powersgd', 1], ['powersgd', -1], ['topk', 0.1], ['topk', 0.5], ['none', 0]])
        for (const bucketBytes of [0, 700, 5000]) {
          const probe = new ReducerProbe(shapes, { compressor, level: level > 0 ? level : compressor === 'topk' ? 0.1 : 1, workers: W, bucketBytes });
          if (compressor !== 'none' && level <= 0) shapes.forEach((s, i) => s.length > 1 && probe.setLevel(i, level));
          const grads = Array.from({ length: W }, (_, w) => shapes.map((s) => Float32Array.from({ length: s.reduce((a, b) => a * b) }, (_, k) => Math.sin(k + 7 * w))));
          const ran = [...probe.step(grads).collectiveBytes];
          const predicted = bucketTraffic({ shapes, spec: spec(compressor), level, commDtype: 'fp32', bucketBytes }).flatMap((t) => [
            ...[t.powerSgdP, t.powerSgdQ].filter((b) => b > 0).map(allReduce),
            ...(t.topkPairs > 0 ? [allGather(t.topkPairs)] : []),
            ...[t.denseBf16, t.dense].filter((b) => b > 0).map(allReduce),
          ]);
          // The workers' agreement on finite gradients: before the exchange, or after its buckets.
          const agreement = allReduce(4 * W);
          const expected = bucketBytes > 0 ? [...predicted, agreement] : [agreement, ...predicted];
          expect(ran, `${compressor} at ${level}, buckets of ${bucketBytes} bytes`).to.deep.equal(expected);
          cases++;
        }
      expect(cases).to.equal(18);
    });

    it('adds a step up: the statistics\' broadcast, compute, compression and the exchange, after backward or overlapped', function () {
      const shapes = [[4, 3], [4], [10, 20]];
      const work = { computeSeconds: 1, forwardSeconds: 0.25, compressionSeconds: 0.1, broadcastFloats: 250 };
      const p = predictStep({ shapes, spec: spec('powersgd'), level: 2, commDtype: 'fp32', bucketBytes: 0 }, work, 4, link, 'ring');
      // Ring of 4: dense 64 B, P 80 B, Q 160 B and the agreement's 16 B, each 6α + 1.5·B/β;
      // the broadcast of 1,000 bytes: 2 rounds.
      const exchange = 4 * 0.006 + (1.5 * (64 + 80 + 160 + 16)) / 1e6;
      const broadcast = 2 * (0.001 + 1000 / 1e6);
      expect(p.collectives).to.equal(5);
      expect(p.communicationSeconds).to.be.closeTo(exchange + broadcast, 1e-12);
      expect(p.afterBackwardSeconds).to.be.closeTo(broadcast + 1 + 0.1 + exchange, 1e-12);
      expect(p.overlappedSeconds).to.be.closeTo(broadcast + Math.max(1 + 0.1, 0.25 + 0.1 + exchange), 1e-12);
      // On a link slow enough, overlap hides compute behind the exchange instead.
      const slow = predictStep({ shapes, spec: spec('powersgd'), level: 2, commDtype: 'fp32', bucketBytes: 0 }, work, 4, { bytesPerSecond: 100, latencySeconds: 0 }, 'ring');
      expect(slow.overlappedSeconds).to.be.closeTo(slow.afterBackwardSeconds - 1 + 0.25, 1e-9);
    });
  });

  describe('the command', function () {
    let tmp;
    before(() => (tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'acc-plan-'))));
    after(() => fs.rmSync(tmp, { recursive: true, force: true }));
    const run = (args) => spawnSync(process.execPath, [CLI, 'plan', ...args], { encoding: 'utf8', timeout: 120000 });

    it('predicts from given compute and compression seconds: JSON, table and chart', function () {
      const json = path.join(tmp, 'plan.json');
      const html = path.join(tmp, 'plan.html');
      const r = run(['--workers', '2,4,1024', '--bandwidth', '8mbit', '--latency', '1ms', '--levels', '1,2', '--compute-seconds', '1', '--forward-seconds', '0.3',
        '--compression-seconds', '0.02,0.03', '--json', json, '--html', html, '--', '--model', 'resnet18', '--compressor', 'powersgd']);
      expect(r.status, r.stderr).to.equal(0);
      const plan = JSON.parse(fs.readFileSync(json, 'utf8'));
      // 8 Mbit/s carries 1448 bytes of payload per 1514-byte frame.
      expect(plan.link).to.deep.equal({ bytesPerSecond: 1e6 * (1448 / 1514), latencySeconds: 0.001 });
      expect(plan.rows.map((row) => row.workers)).to.deep.equal([2, 4, 1024]);
      expect(plan.rows[0].levels.map((l) => l.level)).to.deep.equal([0, 1, 2]);
      // ResNet-18 dense between two: its 11,173,962 floats in three buckets (1 MiB, 25 MiB, the rest)
      // and the agreement, and the statistics' 9,600 floats broadcast, each α + B/β.
      const beta = 1e6 * (1448 / 1514);
      const dense = plan.rows[0].levels[0].prediction;
      const exchange = 4 * 0.001 + (4 * 11173962 + 8) / beta;
      const broadcast = 0.001 + (4 * 9600) / beta;
      expect(dense.afterBackwardSeconds).to.be.closeTo(broadcast + 1 + exchange, 1e-9);
      expect(dense.overlappedSeconds).to.be.closeTo(broadcast + 0.3 + exchange, 1e-9);
      expect(r.stdout).to.match(/resnet18, batch 64 per worker, values sent in fp32; each worker's link 8 Mbit\/s \(7\.651 Mbit\/s of payload\), latency 1000 µs; all-reduce by ring/);
      expect(r.stdout).to.match(/compute 1\.000 s per step \(forward 0\.300 s\), given; compression rank 1 20\.0 ms, rank 2 30\.0 ms/);
      expect(r.stdout).to.match(/^1024 +\d/m);
      const chart = /const plan = (\{.*\});/.exec(fs.readFileSync(html, 'utf8'));
      const datasets = JSON.parse(chart[1]).datasets;
      expect(datasets.map((d) => d.label)).to.deep.equal(['dense, overlapped', 'dense, after backward', 'rank 1, overlapped', 'rank 1, after backward', 'rank 2, overlapped', 'rank 2, after backward']);
      expect(datasets[1].data[0]).to.deep.equal({ x: '2', y: dense.afterBackwardSeconds });
    });

    const bad = [
      [['--algorithm', 'mesh'], /option --algorithm: expected one of ring, tree, got 'mesh'/],
      [['--workers', '1,2'], /option --workers: expected a non-empty list of integers ≥ 2, got 1,2/],
      [['--compute-seconds', '1', '--forward-seconds', '0.2', '--compression-seconds', '0.1'], /option --compression-seconds: one per level of 1, 2, 4, 8, got 1/],
      [['--compute-seconds', '1'], /option --forward-seconds: give it with --compute-seconds/],
      [['--bandwidth', 'fast'], /option --bandwidth: expected a rate/],
    ];
    for (const [args, message] of bad)
      it(`refuses ${args.join(' ')} with exit 2`, function () {
        const r = run([...args, '--', '--model', 'resnet18', '--compressor', 'powersgd']);
        expect(r.status, r.stderr).to.equal(2);
        expect(r.stderr).to.match(message);
      });
  });
});
