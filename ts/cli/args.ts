/**
 * The training options on the command line and in config files, read by the option table
 * (config/options.ts): the parser, the config-file reader and `accordion train --help`; the values'
 * parser and the help's lines serve the other commands' tables too (wrapper-args.ts).
 */
import { readFileSync } from 'node:fs';
import { UsageError } from '../base/errors.js';
import { OPTIONS, OPTION_KEYS, type OptionSpec, type PresetName, type TrainConfig } from '../config/options.js';

/** Options of the command line only: they are not part of a run's configuration. */
const COMMAND_LINE_ONLY: Record<'text' | 'inProcess' | 'config' | 'help', OptionSpec> = {
  text: { flag: '--text', type: 'string', help: 'lstm: a plain text file to train on instead of --data, its lines split 90/5/5 into train/valid/test' },
  inProcess: {
    flag: '--in-process', type: 'flag',
    help: 'with --workers N: the N workers in this one process, each on its own native threads (on a GPU, its own stream of one CUDA context), joined over Gloo, instead of N processes',
  },
  config: { flag: '--config', type: 'string', help: "JSON file of options (names as here or as in a run's config.json); flags override it" },
  help: { flag: '--help', type: 'flag', help: 'show this help' },
};

type Key = keyof TrainConfig | keyof typeof COMMAND_LINE_ONLY;
const ALL: [Key, OptionSpec][] = [...OPTION_KEYS.map((k): [Key, OptionSpec] => [k, OPTIONS[k]]), ...(Object.entries(COMMAND_LINE_ONLY) as [Key, OptionSpec][])];

/** What the command line gave: configuration keys (and text, inProcess, config, help) to values. */
export type TrainArgs = Partial<TrainConfig> & { text?: string; inProcess?: boolean; config?: string; help?: boolean };

/** One value from its text (a flag's argument, or a config file's value as text). */
export function parseValue(spec: OptionSpec, raw: string): unknown {
  const bad = (what: string) => new UsageError(`option ${spec.flag}: ${what}, got '${raw}'`);
  switch (spec.type) {
    case 'int': {
      if (!/^-?\d+$/.test(raw)) throw bad('expected an integer');
      if (!Number.isSafeInteger(Number(raw))) throw bad(`expected an integer of at most ${Number.MAX_SAFE_INTEGER} in magnitude`);
      return Number(raw);
    }
    case 'number': {
      const v = Number(raw);
      if (raw.trim() === '' || !Number.isFinite(v)) throw bad('expected a number');
      return v;
    }
    case 'ints': {
      const parts = raw === '' ? [] : raw.split(',');
      if (parts.some((p) => !/^\d+$/.test(p.trim()))) throw bad('expected comma-separated non-negative integers');
      return parts.map((p) => Number(p));
    }
    case 'numbers': {
      const parts = raw.split(',');
      if (parts.some((p) => p.trim() === '' || !Number.isFinite(Number(p)))) throw bad('expected comma-separated numbers');
      return parts.map((p) => Number(p));
    }
    default:
      if (spec.choices && !spec.choices.includes(raw)) throw bad(`expected one of ${spec.choices.join(', ')}`);
      return raw;
  }
}

/** Options from a JSON file: keys are configuration names (as in a run's config.json) or flag names without dashes. */
export function readConfigFile(file: string): TrainArgs {
  let parsed: unknown;
  try {
    parsed = JSON.parse(readFileSync(file, 'utf8'));
  } catch (err) {
    throw new UsageError(`option --config: cannot read ${file}: ${(err as Error).message}`);
  }
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) throw new UsageError(`option --config: ${file} must hold a JSON object`);
  const out: Record<string, unknown> = {};
  for (const [name, value] of Object.entries(parsed)) {
    const found = ALL.find(([key, spec]) => key === name || spec.flag === `--${name}`);
    if (!found || found[0] === 'config' || found[0] === 'help') throw new UsageError(`option --config: ${file} has an unknown option '${name}'`);
    const [key, spec] = found;
    if (spec.type === 'flag') {
      if (typeof value !== 'boolean') throw new UsageError(`option --config: '${name}' in ${file} must be true or false`);
      // By its configuration name the value is the option's; by a negating flag's name, its opposite.
      out[key] = key === name || !spec.negate ? value : !value;
      continue;
    }
    out[key] = parseValue(spec, Array.isArray(value) ? value.join(',') : String(value));
  }
  return out as TrainArgs;
}

/** The training options of a command line; --config FILE's options come first, flags override them. */
export function parseTrainArgs(argv: string[]): TrainArgs {
  const out: Record<string, unknown> = {};
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    const eq = arg.indexOf('=');
    const flag = arg.startsWith('--') && eq > 0 ? arg.slice(0, eq) : arg;
    const found = ALL.find(([, spec]) => spec.flag === flag);
    if (!found) throw new UsageError(arg.startsWith('-') ? `unknown option ${flag} (see --help)` : `unexpected argument '${arg}' (options start with --)`);
    const [key, spec] = found;
    if (spec.type === 'flag') {
      if (eq > 0) throw new UsageError(`option ${spec.flag} takes no value`);
      out[key] = !spec.negate;
      continue;
    }
    const raw = eq > 0 ? arg.slice(eq + 1) : argv[++i];
    if (raw === undefined || (eq < 0 && raw.startsWith('--'))) throw new UsageError(`option ${spec.flag} needs a value`);
    out[key] = parseValue(spec, raw);
  }
  if (typeof out.config === 'string') {
    const file = out.config;
    delete out.config;
    return { ...readConfigFile(file), ...out } as TrainArgs;
  }
  return out as TrainArgs;
}

const PRESET_WORDS: Record<PresetName, string> = { synthetic: 'on synthetic data', lstm: 'for lstm' };

/** An option's default as the help shows it: "300; 6 on synthetic data, 90 for lstm". */
export function helpDefault(spec: OptionSpec): string | undefined {
  if (spec.type === 'flag' || spec.default === undefined) return undefined;
  const show = (v: unknown) => (Array.isArray(v) ? v.join(',') : String(v));
  const presets = Object.entries(spec.presets ?? {}).map(([name, v]) => `${show(v)} ${PRESET_WORDS[name as PresetName]}`);
  return [show(spec.default), presets.join(', ')].filter(Boolean).join('; ');
}

/** How an option is written with its value: "--lr N", "--milestones A,B", "--quiet". */
export function optionUsage(spec: OptionSpec): string {
  const name = spec.value ?? (spec.type === 'ints' || spec.type === 'numbers' ? 'A,B' : spec.type === 'string' ? 'VALUE' : 'N');
  return spec.type === 'flag' ? spec.flag : `${spec.flag} ${name}`;
}

/** An option's line in a command's help: flag, value, help, choices and default. */
export function optionLine(spec: OptionSpec): string {
  const choices = spec.choices ? ` [${spec.choices.join('|')}]` : '';
  const dflt = helpDefault(spec);
  return `  ${optionUsage(spec).padEnd(26)} ${spec.help}${choices}${dflt ? ` (default: ${dflt})` : ''}`;
}

/** `accordion train`'s options, in the help's order: the option table's, then the command line's own. */
export function trainOptions(): OptionSpec[] {
  return ALL.map(([, spec]) => spec);
}

export function trainHelp(): string {
  return ['Usage: accordion train --model resnet18|vgg19bn|lstm [options]', '', 'Options:', ...trainOptions().map(optionLine)].join('\n');
}
