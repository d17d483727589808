/**
 * The option reference (docs/options.md), generated from the commands' tables so that it says what the
 * parsers accept: `node scripts/options-doc.js` writes it, and a test keeps the file in step.
 */
import type { OptionSpec } from '../config/options.js';
import { helpDefault, optionUsage, trainOptions } from './args.js';
import { CLUSTER_OPTIONS } from './cluster.js';
import { LAUNCH_OPTIONS } from './launch.js';
import { PLAN_OPTIONS } from './plan.js';

const COMMANDS: { command: string; usage: string; options: OptionSpec[] }[] = [
  { command: 'train', usage: 'accordion train --model resnet18|vgg19bn|lstm [options]', options: trainOptions() },
  { command: 'launch', usage: 'accordion launch [launch options] -- <train options>', options: Object.values(LAUNCH_OPTIONS) },
  { command: 'cluster', usage: 'accordion cluster [cluster options] -- <train options>', options: Object.values(CLUSTER_OPTIONS) },
  { command: 'plan', usage: 'accordion plan [plan options] -- <train options>', options: Object.values(PLAN_OPTIONS) },
];

const cell = (text: string) => text.replace(/\|/g, '\\|');

export function optionsReference(): string {
  const out = [
    '# Options',
    '',
    "Every command's options, generated from the tables the commands parse (`node scripts/options-doc.js`;",
    '`test/project/readme.test.js` fails when this page and the tables part). `npm run train -- OPTIONS` passes',
    "them to `accordion train`; a config file (`--config FILE`) takes the same names as a run's",
    '`config.json`. Defaults that depend on the data say so ("6 on synthetic data").',
  ];
  for (const { command, usage, options } of COMMANDS) {
    out.push('', `## accordion ${command}`, '', `\`${usage}\``, '', '| option | default | meaning |', '| --- | --- | --- |');
    for (const spec of options) {
      const choices = spec.choices ? ` (${spec.choices.join(', ')})` : '';
      out.push(`| \`${cell(optionUsage(spec))}\` | ${cell(helpDefault(spec) || '')} | ${cell(spec.help + choices)} |`);
    }
  }
  return out.join('\n') + '\n';
}
