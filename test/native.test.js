import { expect } from 'chai';
import { buildInfo, deviceQuery, deviceCount } from '../lib/index.js';

describe('native addon', function () {
  it('reports how it was built', function () {
    const info = buildInfo();
    expect(info.dnnl).to.match(/^\d+\.\d+\.\d+$/);
    expect(info.openblas).to.match(/OpenBLAS/);
    expect(info.threads).to.be.at.least(1);
    expect(info.models).to.deep.equal(['resnet18', 'vgg19bn', 'lstm']);
    expect(info.cuda.built).to.be.a('boolean');
    if (info.cuda.built) expect(info.cuda.architectures).to.equal('sm_80,sm_90');
    else expect(info.cuda.architectures).to.equal('');
  });

  it('queries CUDA devices without throwing, reporting a driver error as a code', function () {
    const q = deviceQuery();
    expect(q.count).to.equal(deviceCount());
    if (q.count === 0) expect(q.error).to.be.a('string').and.not.equal('');
    else expect(q.devices[0].computeCapability).to.match(/^\d+\.\d+$/);
  });

  it('reports whether NCCL can be loaded, with the reason when it cannot', function () {
    const { nccl } = buildInfo().cuda;
    if (nccl !== true) expect(nccl).to.match(/NCCL|nccl/);
  });
});
