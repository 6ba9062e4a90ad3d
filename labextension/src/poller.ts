// One poller for the sidebar and the status bar: the caller's status (cluster, quota, open runs)
// and their recent runs, every POLL_MS, and at once after an action. A failed poll keeps the last
// answer and says why; the next tick tries again, so a refused action never stops the panel.
import { ISignal, Signal } from '@lumino/signaling';

import { api } from './api';
import { DetachedRunsView, LeaseView, StatusView } from './types';

export const POLL_MS = 400;
const FINISHED_KEPT_S = 600; // "just finished": runs that ended in the last ten minutes
const FINISHED_SHOWN = 5;
const DETACHED_EVERY = 5; // detached runs are asked of the gateway every 5th poll (2 s)

export interface Snapshot {
  status: StatusView | null;
  finished: LeaseView[];
  detached: DetachedRunsView | null; // null until first asked
  error: string | null;
  at: number; // Unix seconds of the answer, for elapsed times
}

export class Poller {
  private _snapshot: Snapshot = { status: null, finished: [], detached: null, error: null, at: 0 };
  private _polls = 0;
  private _detachedNow = true; // ask for detached runs on the next poll (the first, or after an action)
  private _changed = new Signal<this, Snapshot>(this);
  private _timer: number | null = null;
  private _inFlight: Promise<void> | null = null;

  get changed(): ISignal<this, Snapshot> {
    return this._changed;
  }

  get snapshot(): Snapshot {
    return this._snapshot;
  }

  start(): void {
    if (this._timer === null) {
      this._timer = window.setInterval(() => void this.refresh(), POLL_MS);
      void this.refresh();
    }
  }

  /** Poll now (after an action); concurrent calls share one request. `detached`: ask for the
   * detached runs too, whatever the turn. */
  refresh(detached = false): Promise<void> {
    this._detachedNow = this._detachedNow || detached;
    if (!this._inFlight) {
      this._inFlight = this._poll().finally(() => (this._inFlight = null));
    }
    return this._inFlight;
  }

  private async _poll(): Promise<void> {
    try {
      const askDetached = this._detachedNow || this._polls % DETACHED_EVERY === 0;
      this._polls += 1;
      this._detachedNow = false;
      const [status, recent, detached] = await Promise.all([
        api<StatusView>('status'),
        api<LeaseView[]>('leases?all=true'),
        askDetached ? detachedRuns() : Promise.resolve(this._snapshot.detached)
      ]);
      const now = Date.now() / 1000;
      const finished = recent
        .filter(l => l.user === status.user && l.state === 'ended' && l.released_at !== null)
        .filter(l => now - (l.released_at as number) < FINISHED_KEPT_S)
        .sort((a, b) => (b.released_at as number) - (a.released_at as number))
        .slice(0, FINISHED_SHOWN);
      this._snapshot = { status, finished, detached, error: null, at: now };
    } catch (error) {
      this._snapshot = { ...this._snapshot, error: (error as Error).message };
    }
    this._changed.emit(this._snapshot);
  }
}

/** The detached runs, or why they cannot be listed (a refusal here never blanks the panel). */
const detachedRuns = (): Promise<DetachedRunsView> =>
  api<DetachedRunsView>('runs').catch(error => ({ available: false, message: (error as Error).message, runs: [] }));
