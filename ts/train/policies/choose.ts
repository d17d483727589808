/**
 * Which policy a configuration runs, and the level every matrix starts at.
 */
import { AccordionPolicy } from './accordion.js';
import { AutoPolicy } from './auto.js';
import { BatchPolicy } from './batch.js';
import { BatchCompressionPolicy } from './batch-compression.js';
import type { Policy } from './policy.js';
import type { PolicySettings } from './settings.js';
import { SmithPolicy } from './smith.js';
import { StaticPolicy } from './static.js';

export function choosePolicy(s: PolicySettings): Policy {
  switch (s.config.adapt) {
    case 'auto':
      return new AutoPolicy(s);
    case 'batch':
      return new BatchPolicy(s);
    case 'smith':
      return new SmithPolicy(s);
    case 'batch+compression':
      return new BatchCompressionPolicy(s);
    default:
      return s.config.accordion === 'on' ? new AccordionPolicy(s) : new StaticPolicy(s);
  }
}

/** Accordion starts at its low level; automatic levels and static compression at the reference. */
export function initialLevel(s: Pick<PolicySettings, 'config' | 'spec'>): number {
  return s.config.accordion === 'on' && s.config.adapt !== 'auto' ? s.spec.low : s.spec.reference;
}
