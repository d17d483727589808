// What gpu-check.jsonl files say, stage by stage (on any machine with Node).
import * as fs from 'node:fs';

export function summary(files) {
  const rows = files.flatMap((f) => fs.readFileSync(f, 'utf8').split('\n').filter(Boolean).map((line) => {
    try {
      return JSON.parse(line);
    } catch {
      return { stage: '?', event: 'unreadable', line };
    }
  }));
  const lines = [];
  // Families that passed (or ran clean) are listed together; anything else on a line of its own.
  const good = new Map();
  const flush = () => {
    for (const [what, names] of good) lines.push(`  ${what} (${names.length}): ${names.join(', ')}`);
    good.clear();
  };
  const group = (what, name) => good.set(what, [...(good.get(what) ?? []), name]);
  for (const r of rows) {
    if (r.event === 'end' && 'exitCode' in r) {
      flush();
      lines.push(`${r.stage}: ${r.status} (exit ${r.exitCode}, ${r.seconds} s)`);
    } else if (r.event === 'no device' || r.event === 'no runtime') lines.push(`  ${r.event}: ${r.error}`);
    else if (r.event === 'probe') lines.push(`  device ${r.device ? r.device.device : 'none'}; build ${r.build}${r.buildLoads ? '' : ' (does not load)'}; compute-sanitizer ${r.sanitizer.acceptsDevice ? 'accepts the device' : `not usable: ${r.sanitizer.why}`}; torch ${r.torch}`);
    else if (r.event === 'abi') lines.push(`  abi: ${r.pass ? 'passed' : `FAILED: ${r.error ?? r.output}`}`);
    else if (r.event === 'family' && r.status === 'passed') group('lab families passed', r.family);
    else if (r.event === 'family') lines.push(`  lab ${r.family}: ${r.status}${r.error ? ` (${r.error})` : ''}`);
    else if (r.event === 'sanitizer' && r.status === 'clean') group(`${r.tool} clean`, r.family);
    else if (r.event === 'sanitizer') lines.push(`  ${r.tool ?? 'sanitizer'} ${r.family ?? ''}: ${r.status}${r.error ? ` (${r.error})` : ''}${r.errors ? `, ${r.errors} reported: ${r.findings.split('\n')[0]}` : ''}`);
    else if (r.event === 'tests') lines.push(`  tests: ${r.passes} passing, ${r.failures} failing, ${r.pending} pending`);
    else if (r.event === 'test' && r.state === 'failed') lines.push(`  FAILED ${r.test}: ${String(r.error).split('\n')[0]}`);
    else if (r.event === 'bench') lines.push(`  bench ${r.bench}: ${r.status}`);
    else if (r.event === 'peer') lines.push(`  peer ${r.model} ${r.config}: ${r.status}${r.error ? ` (${r.error})` : ''}`);
    else if (r.event === 'lab summary' && Object.values(r.families).some((v) => v.startsWith('not run (dry'))) lines.push('  lab: not run (dry run)');
    else if (r.event === 'reproduce plan') lines.push(`  reproduce: ${r.epochs} epochs a run (pilot epoch ${r.epochSeconds.toFixed(1)} s, start ${r.startSeconds.toFixed(1)} s)`);
    else if (r.event === 'reproduce run') lines.push(`  ${r.config} seed ${r.seed}: ${r.exitCode === 0 ? `${(100 * r.finalTestAccuracy).toFixed(2)}% after ${r.epochs} epochs, ${r.floatsSentTotal} floats` : `FAILED (exit ${r.exitCode})`}`);
    else if (r.event === 'reproduce' || r.event === 'reproduce report') lines.push(`  ${r.event}: ${r.status ?? `exit ${r.exitCode}`}${r.error ? ` (${r.error})` : ''}`);
    else if (r.op && r.pass === false) lines.push(`  FAILED check ${r.family} ${r.op} ${r.shape ?? ''}: ${(r.failures || []).join('; ')}`);
    else if (r.event === 'unreadable') lines.push(`  (an unreadable line: ${r.line.slice(0, 80)})`);
  }
  flush();
  return lines.join('\n');
}
