// Where the addon comes from: the package's own build here, and the platform package's requirement
// on the system's glibc, refused with both versions named when the system is older.
import { expect } from 'chai';
import { checkGlibc, loadAddon } from '../../lib/native/addon-location.js';
import { addonSource } from '../../lib/native/binding.js';
import { ROOT } from '../helpers/paths.js';

const runtimeGlibc = process.report.getReport().header.glibcVersionRuntime;

describe('the addon location', function () {
  it('loads the package\'s own build where there is one', function () {
    expect(addonSource.kind).to.equal('build');
    expect(loadAddon().source.file).to.equal(`${ROOT}/build/Release/accordion.node`);
  });

  it('refuses a platform package that needs a newer glibc than this system\'s, naming both', function () {
    let thrown;
    try {
      checkGlibc('/some/package', { glibc: '99.1', glibcxx: '3.4.99' });
    } catch (err) {
      thrown = err;
    }
    expect(thrown?.code).to.equal('ERR_GLIBC');
    expect(thrown.message).to.include('needs glibc 99.1 or newer').and.include(`this system has glibc ${runtimeGlibc}`).and.include('--build-from-source');
  });

  it('accepts one that needs this system\'s glibc or an older one (versions compared as numbers: 2.9 < 2.34)', function () {
    expect(() => checkGlibc('/some/package', { glibc: runtimeGlibc, glibcxx: '3.4.30' })).not.to.throw();
    expect(() => checkGlibc('/some/package', { glibc: '2.9' })).not.to.throw();
  });
});
