// PURE: how numbers and runs read in the panels.
import { DetachedRunView, LeaseView } from './types';

export const gpus = (n: number): string => {
  const text = Number.isInteger(n) ? String(n) : n.toFixed(2).replace(/0+$/, '');
  return `${text} GPU${n === 1 ? '' : 's'}`;
};

export function duration(seconds: number | null): string {
  if (seconds === null || seconds === undefined) {
    return '';
  }
  if (seconds < 60) {
    return `${Math.floor(seconds)} s`;
  }
  if (seconds < 3600) {
    return `${Math.floor(seconds / 60)} min ${Math.floor(seconds % 60)} s`;
  }
  return `${(seconds / 3600).toFixed(1)} h`;
}

export const hours = (h: number | null): string => (h === null ? 'no limit' : `${h.toFixed(2)} GPU-h`);

/** GPU-seconds so far: the ledger's figure once ended, else GPUs x time held. */
export function gpuSeconds(lease: LeaseView, now: number): number {
  if (lease.gpu_seconds !== null && lease.gpu_seconds !== undefined) {
    return lease.gpu_seconds;
  }
  return lease.granted_at ? lease.gpus * Math.max(0, now - lease.granted_at) : 0;
}

export function elapsed(lease: LeaseView, now: number): number {
  const start = lease.granted_at ?? lease.requested_at;
  return Math.max(0, (lease.released_at ?? now) - start);
}

/** One line for a run's state: "queued #2 (reason)", "running · step 340", "finished"; a
 * background run's line starts with "background · ". */
export function stateText(lease: LeaseView): string {
  return (lease.background ? 'background · ' : '') + plainStateText(lease);
}

function plainStateText(lease: LeaseView): string {
  if (lease.state === 'queued') {
    return `queued #${lease.position ?? '?'}${lease.reason ? ` (${lease.reason})` : ''}`;
  }
  if (lease.state === 'ended') {
    return lease.end_reason || 'ended';
  }
  const step = lease.step !== null && lease.step !== undefined ? ` · step ${lease.step}` : '';
  return (lease.state === 'granted' ? 'starting' : 'running') + step;
}

/** The status bar's words for one notebook's newest open run (or "idle"). */
export function statusBarText(lease: LeaseView | undefined): string {
  if (!lease || lease.state === 'ended') {
    return 'GPUs: idle';
  }
  if (lease.state === 'queued') {
    return `GPUs: queued #${lease.position ?? '?'}`;
  }
  const step = lease.step !== null && lease.step !== undefined ? ` · step ${lease.step}` : '';
  return `${gpus(lease.gpus)}${step}`;
}

export const notebookName = (path: string | null): string =>
  path ? path.split('/').pop() || path : '(not from a notebook)';

const DETACHED_LIVE = ['submitted', 'queued', 'starting', 'running'];

export const detachedLive = (run: DetachedRunView): boolean => DETACHED_LIVE.includes(run.state);

/** The cell that follows a detached run from the notebook (Python, so it works whether or not the
 * kernel loaded the extension): its handle named after the run, never after its function (which
 * it would shadow). */
export const attachCode = (run: DetachedRunView): string =>
  `import gpusession as gs\nrun_${run.run_id.slice(0, 8)} = gs.attach("${run.run_id}")`;

/** "running · 3 min 2 s" or "finished · kept 6.9 days more". */
export function detachedText(run: DetachedRunView, now: number): string {
  if (detachedLive(run)) {
    return `${run.state} · ${duration(Math.max(0, now - run.started))}`;
  }
  const kept = Math.max(0, run.expires - now);
  const left = kept >= 86400 ? `${(kept / 86400).toFixed(1)} days` : duration(kept);
  return `${run.end_reason || run.state} · kept ${left} more`;
}
