// The reducer's state between steps through ReducerProbe: restarting a round, refusing non-finite gradients
// without a trace, and the gradient norms kept for Accordion; on the CPU and on a GPU (pending without one).
import { expect } from 'chai';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { DEVICES } from '../helpers/devices.js';
import { makeRng } from '../helpers/gradcheck.js';
import { expectEqualArrays, expectThrowsCode, frobenius, numelOf, probe, probeDevice, probesOn, randn } from '../helpers/compression-checks.js';

const testingUrl = new URL('../../lib/testing.js', import.meta.url).href;

// ---------------------------------------------------------------------------------------------

for (const target of DEVICES) {
  describe(`gradient compression (ReducerProbe) on ${target}`, function () {
    probesOn(target);

    describe('repeating one round (the benchmark\'s restart)', function () {
      it('restart() gives the round of setInput() again: the same gradients, zero memories and the first Q', function () {
        const shapes = [[6, 3, 3, 3], [10, 8], [6]];
        const rng = makeRng(12);
        const grads = shapes.map((s) => randn(rng, numelOf(s)));
        for (const [compressor, level] of [['powersgd', 2], ['topk', 0.2]]) {
          const p = probe(shapes, { compressor, level, minCompressionRate: 0 });
          const state = () => shapes.map((_, i) => [p.memory(0, i), p.q(0, i)]);
          const q0 = shapes.map((_, i) => p.q(0, i));
          p.setInput([grads]);
          p.run();
          const first = state();
          // A second round on the first one's output and memory. For PowerSGD that is another state
          // (Q warm-started, another memory); a lone TopK worker's second input, sparse(a) + e, is a again.
          p.run();
          if (compressor === 'powersgd') expect(state(), `${compressor}: the second round`).to.not.deep.equal(first);
          p.restart();
          shapes.forEach((_, i) => {
            if (p.memory(0, i)) expect(Array.from(p.memory(0, i)).every((v) => v === 0), `${compressor}: memory ${i} after restart`).to.equal(true);
            expect(p.q(0, i), `${compressor}: Q ${i} after restart`).to.deep.equal(q0[i]);
          });
          p.run();
          expect(state(), `${compressor}: the round after restart`).to.deep.equal(first);
        }
      });

      it('refuses restart() before setInput() and inputs of the wrong size', function () {
        const p = probe([[4, 3]], { compressor: 'topk', level: 0.5 });
        expect(() => p.restart()).to.throw(/setInput/);
        expect(() => p.setInput([[new Float32Array(11)]])).to.throw(/12 floats/);
        expect(() => p.setInput([])).to.throw(/one array per worker/);
      });
    });

    describe('non-finite gradients', function () {
      const shapes = [[6, 4], [4], [3, 5]];

      function twins(options) {
        return [probe(shapes, options), probe(shapes, options)];
      }

      it('refuses NaN/Inf with ERR_NUMERICAL naming the parameter, leaving memory, Q and norms untouched', function () {
        for (const compressor of ['powersgd', 'topk']) {
          const options = { compressor, level: compressor === 'powersgd' ? 2 : 0.25, accumulateNorms: true, minCompressionRate: 0 };
          const [p, twin] = twins(options);
          const rng = makeRng(21);
          const first = shapes.map((s) => randn(rng, numelOf(s)));
          p.step([first]);
          twin.step([first]);
          for (const [param, bad] of [[2, NaN], [1, Infinity], [0, -Infinity]]) {
            const before = shapes.map((_, i) => [p.memory(0, i), p.q(0, i)]);
            const grads = shapes.map((s) => randn(rng, numelOf(s)));
            grads[param][3] = bad;
            expectThrowsCode(() => p.step([grads]), 'ERR_NUMERICAL', `'p${param}'`);
            shapes.forEach((_, i) => {
              const [e, q] = before[i];
              if (e) expectEqualArrays(p.memory(0, i), e, `${compressor} memory p${i}`);
              else expect(p.memory(0, i)).to.equal(null);
              if (q) expectEqualArrays(p.q(0, i), q, `${compressor} Q p${i}`);
            });
          }
          // The refused steps left no trace: both probes continue identically.
          const next = shapes.map((s) => randn(rng, numelOf(s)));
          const a = p.step([next]).outputs[0];
          const b = twin.step([next]).outputs[0];
          a.forEach((o, i) => expectEqualArrays(o, b[i], `${compressor} output p${i} after the refusal`));
          expectEqualArrays(p.norms(0), twin.norms(0), `${compressor} norms`);
        }
      });

      it('refuses a step where every worker has a non-finite gradient (W = 2)', function () {
        const p = probe(shapes, { compressor: 'powersgd', level: 1, workers: 2, minCompressionRate: 0 });
        const rng = makeRng(22);
        const grads = [0, 1].map(() => shapes.map((s) => randn(rng, numelOf(s))));
        grads[0][0][0] = NaN;
        grads[1][0][5] = Infinity;
        expectThrowsCode(() => p.step(grads), 'ERR_NUMERICAL', "'p0'");
        for (const w of [0, 1]) expectEqualArrays(p.memory(w, 0), new Float32Array(24), `memory of worker ${w}`);
        const ok = [0, 1].map(() => shapes.map((s) => randn(rng, numelOf(s))));
        const { outputs } = p.step(ok);
        outputs[0].forEach((o) => o.forEach((v) => expect(Number.isFinite(v)).to.equal(true)));
      });

      it('refuses a step where only one of two workers has a NaN, without hanging', function () {
        // Run in a child process: if the healthy worker waits forever in the all-reduce, the test
        // must fail rather than hang mocha.
        const script = `
          import { ReducerProbe } from ${JSON.stringify(testingUrl)};
          const p = new ReducerProbe([[3, 2]], { compressor: 'powersgd', level: 1, workers: 2, minCompressionRate: 0, device: ${JSON.stringify(probeDevice())} });
          const good = new Float32Array([1, 2, 3, 4, 5, 6]);
          const bad = new Float32Array([1, NaN, 3, 4, 5, 6]);
          let code = null;
          try { p.step([[good], [bad]]); } catch (err) { code = err.code + ' ' + err.message; }
          const memories = [Array.from(p.memory(0, 0)), Array.from(p.memory(1, 0))];
          console.log(JSON.stringify({ code, memories }));
        `;
        const child = spawnSync(process.execPath, ['--input-type=module', '-e', script], {
          encoding: 'utf8',
          timeout: 5000,
          cwd: fileURLToPath(new URL('../..', import.meta.url)),
        });
        expect(child.error?.code ?? null, 'the step hung (deadlock: the healthy worker waits in the all-reduce)').to.equal(null);
        expect(child.status, child.stderr).to.equal(0);
        const { code, memories } = JSON.parse(child.stdout.trim().split('\n').pop());
        expect(code).to.match(/^ERR_NUMERICAL .*'p0'/);
        expect(memories).to.deep.equal([new Array(6).fill(0), new Array(6).fill(0)]);
      });
    });

    describe('gradient norms for Accordion (docs/algorithms.md §4.1)', function () {
      it('accumulates the norm of the summed raw local gradients, and restarts on reading', function () {
        const shapes = [[5, 4], [4]];
        const W = 2;
        const p = probe(shapes, { compressor: 'powersgd', level: 1, workers: W, accumulateNorms: true, minCompressionRate: 0 });
        const rng = makeRng(31);
        const g = Array.from({ length: W }, () => shapes.map((s) => randn(rng, numelOf(s))));
        const neg = g.map((gs) => gs.map((x) => x.map((v) => -v)));
        p.step(g);
        p.step(neg);
        for (let w = 0; w < W; w++) {
          const norms = p.norms(w);
          expect(norms).to.be.instanceOf(Float64Array);
          expect(Array.from(norms), 'g then −g').to.deep.equal([0, 0]);
        }
        p.step(g);
        p.step(g);
        for (let w = 0; w < W; w++) {
          // Each worker's own raw gradients, not the compressed average.
          const norms = p.norms(w);
          shapes.forEach((_, i) => expect(norms[i], `worker ${w} p${i}`).to.be.closeTo(2 * frobenius(g[w][i]), 1e-5));
          expect(Array.from(p.norms(w)), 'restarted').to.deep.equal([0, 0]);
        }
      });

      it('refuses norms() when they are not accumulated', function () {
        const p = probe([[3, 3]], { compressor: 'topk', level: 0.5 });
        expectThrowsCode(() => p.norms(0), 'ERR_INVALID_ARGUMENT');
      });
    });
  });
}
