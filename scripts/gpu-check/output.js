// The GPU check's two files: $OUT/gpu-check.jsonl, one JSON object a row, appended as each row ends
// (a killed stage leaves every finished row), and $OUT/gpu-check.log, the output; and the commands
// it runs, their output streamed to the terminal and the log, each under a deadline.
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';

export const now = () => new Date().toISOString().replace(/\.\d+Z$/, 'Z');

export class Output {
  constructor(dir, stage) {
    fs.mkdirSync(dir, { recursive: true });
    this.results = path.join(dir, 'gpu-check.jsonl');
    this.log = path.join(dir, 'gpu-check.log');
    this.stage = stage;
    /** Children still running, killed when the stage's time is up. */
    this.children = new Set();
  }

  row(fields) {
    fs.appendFileSync(this.results, JSON.stringify({ stage: this.stage, time: now(), ...fields }) + '\n');
  }

  say(text) {
    process.stdout.write(`${text}\n`);
    fs.appendFileSync(this.log, `${text}\n`);
  }

  /**
   * Runs `command` for at most `seconds` (SIGTERM, then SIGKILL 5 s later; status 124 as timeout(1)
   * gives), its output to the terminal and the log (at most `cap` lines of it there) unless `quiet`.
   * Resolves to { status, output }.
   */
  run(command, args, { seconds = 60, cap = 400, env = process.env, quiet = false, input } = {}) {
    return new Promise((resolve) => {
      let child;
      try {
        child = spawn(command, args, { env, stdio: [input === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'] });
      } catch (e) {
        resolve({ status: 127, output: String(e.message) });
        return;
      }
      this.children.add(child);
      let output = '';
      let lines = 0;
      let timedOut = false;
      const take = (chunk) => {
        const text = chunk.toString();
        output += text;
        if (quiet) return;
        for (const line of text.split(/(?<=\n)/)) {
          lines += line.endsWith('\n') ? 1 : 0;
          if (lines <= cap) {
            process.stdout.write(line);
            fs.appendFileSync(this.log, line);
          } else if (lines === cap + 1 && line.endsWith('\n')) {
            fs.appendFileSync(this.log, `[gpu-check: the rest of this output is left out of the log after ${cap} lines]\n`);
          }
        }
      };
      child.stdout.on('data', take);
      child.stderr.on('data', take);
      if (input !== undefined) child.stdin.end(input);
      const term = setTimeout(() => {
        timedOut = true;
        child.kill('SIGTERM');
        setTimeout(() => child.kill('SIGKILL'), 5000).unref();
      }, Math.max(1, seconds) * 1000);
      child.on('error', (e) => (output += String(e.message)));
      child.on('close', (code, signal) => {
        clearTimeout(term);
        this.children.delete(child);
        resolve({ status: timedOut ? 124 : (code ?? 128 + (signal === 'SIGKILL' ? 9 : 15)), output });
      });
    });
  }

  killAll() {
    for (const child of this.children) child.kill('SIGKILL');
  }
}
