import { expect } from 'chai';
import { endOfEpoch, initialState, isCritical, normChangeRatio, wholeModelNorm } from '../../lib/train/rules/accordion.js';

const rule = { eta: 0.5, interval: 10 };

/** Runs the rule for one parameter from a check at epoch 0 (norm `old`) to one at epoch 10 (norm `curr`). */
function regimeAfter(old, curr) {
  let state = initialState(1);
  state = endOfEpoch(state, { epoch: 0, norms: [old], lrCurrent: 0.1, lrNext: 0.1 }, rule).state;
  for (let e = 1; e < 10; e++) state = endOfEpoch(state, { epoch: e, norms: [123], lrCurrent: 0.1, lrNext: 0.1 }, rule).state;
  return endOfEpoch(state, { epoch: 10, norms: [curr], lrCurrent: 0.1, lrNext: 0.1 }, rule).state.regimes[0];
}

describe('Accordion rule (docs/algorithms.md §4.2–§4.4)', function () {
  const cases = [
    [10, 5, 'critical', 'ratio 0.5: the boundary is critical'],
    [10, 5.1, 'stable', 'ratio 0.49'],
    [10, 4.9, 'critical', 'ratio 0.51'],
    [10, 15, 'critical', 'ratio 0.5 upwards'],
    [10, 14.9, 'stable', 'ratio 0.49 upwards'],
    [0, 3, 'critical', 'old = 0'],
    [NaN, 3, 'critical', 'NaN norm'],
    [10, NaN, 'critical', 'NaN current norm'],
  ];
  for (const [old, curr, expected, why] of cases) {
    it(`(old ${old}, curr ${curr}) → ${expected === 'critical' ? 'low' : 'high'} compression (${why})`, function () {
      expect(regimeAfter(old, curr)).to.equal(expected);
    });
  }

  it('computes the ratio exactly and treats NaN as critical', function () {
    expect(normChangeRatio(10, 5)).to.equal(0.5);
    expect(normChangeRatio(10, 15)).to.equal(0.5);
    expect(isCritical(0.5, 0.5)).to.equal(true);
    expect(isCritical(0.49, 0.5)).to.equal(false);
    expect(isCritical(NaN, 0.5)).to.equal(true);
  });

  it('chooses low compression at epoch 0 and starts critical', function () {
    const s0 = initialState(3);
    expect(s0.regimes).to.deep.equal(['critical', 'critical', 'critical']);
    const d = endOfEpoch(s0, { epoch: 0, norms: [1, 2, 3], lrCurrent: 0.1, lrNext: 0.1 }, rule);
    expect(d.checked).to.equal(true);
    expect(d.state.regimes).to.deep.equal(['critical', 'critical', 'critical']);
    expect(d.switches).to.deep.equal([]);
  });

  it('checks only every interval epochs, against the norms stored at the previous check', function () {
    let state = endOfEpoch(initialState(1), { epoch: 0, norms: [10], lrCurrent: 0.1, lrNext: 0.1 }, rule).state;
    // Between checks nothing changes, whatever the norms do.
    for (let e = 1; e < 10; e++) {
      const d = endOfEpoch(state, { epoch: e, norms: [10.1], lrCurrent: 0.1, lrNext: 0.1 }, rule);
      expect(d.checked).to.equal(false);
      expect(d.ratios).to.deep.equal([undefined]);
      expect(d.state.regimes).to.deep.equal(['critical']);
      state = d.state;
    }
    const at10 = endOfEpoch(state, { epoch: 10, norms: [9], lrCurrent: 0.1, lrNext: 0.1 }, rule);
    expect(at10.ratios[0]).to.be.closeTo(0.1, 1e-12); // against epoch 0's 10, not epoch 9's 10.1
    expect(at10.state.regimes).to.deep.equal(['stable']);
    expect(at10.switches).to.deep.equal([{ index: 0, from: 'critical', to: 'stable' }]);
    // The next check compares with epoch 10's norm.
    state = at10.state;
    for (let e = 11; e < 20; e++) state = endOfEpoch(state, { epoch: e, norms: [1], lrCurrent: 0.1, lrNext: 0.1 }, rule).state;
    const at20 = endOfEpoch(state, { epoch: 20, norms: [4], lrCurrent: 0.1, lrNext: 0.1 }, rule);
    expect(at20.ratios[0]).to.be.closeTo(5 / 9, 1e-12);
    expect(at20.state.regimes).to.deep.equal(['critical']);
  });

  it('a learning-rate decrease forces low compression at any epoch; a rise does not', function () {
    let state = endOfEpoch(initialState(2), { epoch: 0, norms: [10, 10], lrCurrent: 0.1, lrNext: 0.1 }, rule).state;
    state = endOfEpoch({ ...state }, { epoch: 10, norms: [9, 9], lrCurrent: 0.1, lrNext: 0.1 }, rule).state;
    expect(state.regimes).to.deep.equal(['stable', 'stable']);
    const rise = endOfEpoch(state, { epoch: 11, norms: [1, 1], lrCurrent: 0.1, lrNext: 0.16 }, rule);
    expect(rise.lrOverride).to.equal(false);
    expect(rise.state.regimes).to.deep.equal(['stable', 'stable']);
    const decay = endOfEpoch(state, { epoch: 13, norms: [1, 1], lrCurrent: 0.4, lrNext: 0.04 }, rule);
    expect(decay.checked).to.equal(false);
    expect(decay.lrOverride).to.equal(true);
    expect(decay.state.regimes).to.deep.equal(['critical', 'critical']);
    expect(decay.switches.map((s) => s.to)).to.deep.equal(['critical', 'critical']);
  });

  it('decides per parameter', function () {
    let state = endOfEpoch(initialState(3), { epoch: 0, norms: [10, 10, 0], lrCurrent: 1, lrNext: 1 }, rule).state;
    const d = endOfEpoch(state, { epoch: 10, norms: [9, 2, 1], lrCurrent: 1, lrNext: 1 }, rule);
    expect(d.state.regimes).to.deep.equal(['stable', 'critical', 'critical']);
  });

  it('uses the norm of the summed gradient for the whole model', function () {
    expect(wholeModelNorm([3, 4])).to.equal(5);
  });
});
