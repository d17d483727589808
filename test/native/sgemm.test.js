// fp32 matrix products on either library (ops/cpu_sgemm.h): OpenBLAS, or oneDNN where OpenBLAS fell
// back to its generic Prescott kernels. OPENBLAS_CORETYPE chooses OpenBLAS's kernels, so each path
// runs on any x86-64 machine: Prescott sends the engine to oneDNN, Haswell keeps it on OpenBLAS. A
// linear layer's forward and backward against float64, on each.
import { spawnSync } from 'node:child_process';
import * as path from 'node:path';
import { expect } from 'chai';
import { buildInfo } from '../../lib/index.js';
import { linearRef, makeRng, randomNormal } from '../helpers/gradcheck.js';
import { ROOT } from '../helpers/paths.js';

const [ROWS, IN, OUT] = [37, 53, 29];

/** The linear layer's output, input gradient and weight gradient in a process whose OpenBLAS runs `coreType`'s kernels. */
function linearIn(coreType, x, w, b, dy) {
  const script = `
    import { LayerProbe } from ${JSON.stringify(path.join(ROOT, 'lib/testing.js'))};
    import { buildInfo } from ${JSON.stringify(path.join(ROOT, 'lib/index.js'))};
    const [x, w, b, dy] = JSON.parse(process.argv[1]).map((a) => Float32Array.from(a));
    const probe = new LayerProbe('linear', { inFeatures: ${IN}, outFeatures: ${OUT} });
    probe.setValue('weight', w);
    probe.setValue('bias', b);
    const y = Array.from(probe.forward(x, [${ROWS}, ${IN}]).data);
    const dx = Array.from(probe.backward(dy));
    const dw = Array.from(probe.state().find((e) => e.name === 'weight').grad);
    console.log(JSON.stringify({ cpu: buildInfo().cpu, openblas: buildInfo().openblas, y, dx, dw }));`;
  const args = JSON.stringify([x, w, b, dy].map((a) => Array.from(a)));
  const r = spawnSync(process.execPath, ['--input-type=module', '-e', script, args], { encoding: 'utf8', env: { ...process.env, OPENBLAS_CORETYPE: coreType } });
  expect(r.status, r.stderr).to.equal(0);
  return JSON.parse(r.stdout);
}

/** The largest |got − want| / scale. */
const worst = (got, want, scale) => got.reduce((m, g, i) => Math.max(m, Math.abs(g - want[i]) / (scale[i] || 1)), 0);

describe('fp32 matrix products on OpenBLAS and on oneDNN', function () {
  this.timeout(60000);

  it('names the library in buildInfo: oneDNN exactly where OpenBLAS runs its generic Prescott kernels', function () {
    const info = buildInfo();
    expect(info.cpu.sgemm).to.equal(/ Prescott /.test(info.openblas) ? 'onednn' : 'openblas');
  });

  for (const [coreType, library] of [['Prescott', 'onednn'], ['Haswell', 'openblas']]) {
    it(`with OpenBLAS's ${coreType} kernels, multiplies on ${library}: a linear layer's forward and backward equal float64 to fp32's accuracy`, function () {
      const rng = makeRng(11);
      const x = randomNormal(ROWS * IN, rng), w = randomNormal(OUT * IN, rng, 0.3), b = randomNormal(OUT, rng), dy = randomNormal(ROWS * OUT, rng);
      const out = linearIn(coreType, x, w, b, dy);
      expect(out.openblas).to.contain(` ${coreType} `);
      expect(out.cpu.sgemm).to.equal(library);
      const abs = (a) => Float64Array.from(a, Math.abs);
      const y = linearRef(x, [ROWS, IN], w, OUT, b), yScale = linearRef(abs(x), [ROWS, IN], abs(w), OUT, abs(b));
      expect(worst(out.y, y.data, yScale.data), 'forward').to.be.below(1e-5);
      // dx = dy·W (rows × in) and dW = dyᵀ·x (out × in), in float64.
      const dx = new Float64Array(ROWS * IN), dxScale = new Float64Array(ROWS * IN), dw = new Float64Array(OUT * IN), dwScale = new Float64Array(OUT * IN);
      for (let r = 0; r < ROWS; r++)
        for (let o = 0; o < OUT; o++)
          for (let i = 0; i < IN; i++) {
            dx[r * IN + i] += dy[r * OUT + o] * w[o * IN + i];
            dxScale[r * IN + i] += Math.abs(dy[r * OUT + o] * w[o * IN + i]);
            dw[o * IN + i] += dy[r * OUT + o] * x[r * IN + i];
            dwScale[o * IN + i] += Math.abs(dy[r * OUT + o] * x[r * IN + i]);
          }
      expect(worst(out.dx, dx, dxScale), 'input gradient').to.be.below(1e-5);
      expect(worst(out.dw, dw, dwScale), 'weight gradient').to.be.below(1e-5);
    });
  }
});
