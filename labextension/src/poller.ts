// One poller for the sidebar and the status bar: the caller's status (cluster, quota, open runs)
// and their recent runs, every POLL_MS, and at once after an action. A failed poll keeps the last
// answer and says why; the next tick tries again, so a refused action never stops the panel.
import { ISignal, Signal } from '@lumino/signaling';

import { api } from './api';
import { LeaseView, StatusView } from './types';

export const POLL_MS = 400;
const FINISHED_KEPT_S = 600; // "just finished": runs that ended in the last ten minutes
const FINISHED_SHOWN = 5;

export interface Snapshot {
  status: StatusView | null;
  finished: LeaseView[];
  error: string | null;
  at: number; // Unix seconds of the answer, for elapsed times
}

export class Poller {
  private _snapshot: Snapshot = { status: null, finished: [], error: null, at: 0 };
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

  /** Poll now (after an action); concurrent calls share one request. */
  refresh(): Promise<void> {
    if (!this._inFlight) {
      this._inFlight = this._poll().finally(() => (this._inFlight = null));
    }
    return this._inFlight;
  }

  private async _poll(): Promise<void> {
    try {
      const [status, recent] = await Promise.all([
        api<StatusView>('status'),
        api<LeaseView[]>('leases?all=true')
      ]);
      const now = Date.now() / 1000;
      const finished = recent
        .filter(l => l.user === status.user && l.state === 'ended' && l.released_at !== null)
        .filter(l => now - (l.released_at as number) < FINISHED_KEPT_S)
        .sort((a, b) => (b.released_at as number) - (a.released_at as number))
        .slice(0, FINISHED_SHOWN);
      this._snapshot = { status, finished, error: null, at: now };
    } catch (error) {
      this._snapshot = { ...this._snapshot, error: (error as Error).message };
    }
    this._changed.emit(this._snapshot);
  }
}
