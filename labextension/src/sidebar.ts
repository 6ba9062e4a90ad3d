// The "GPUs" sidebar: capacity per node, your runs (running, queued, just finished) with a stop
// button, your detached runs (across kernels) with attach and stop, your quota and GPU-hours
// this week. Redrawn from the poller's snapshot; a stop that the
// server refuses is shown in words and the panel keeps polling.
import { Widget } from '@lumino/widgets';

import { api } from './api';
import { el } from './dom';
import {
  attachCode, detachedLive, detachedText, duration, elapsed, gpuSeconds, gpus, hours, notebookName, stateText
} from './format';
import { Poller, Snapshot } from './poller';
import { ClusterView, DetachedRunView, DetachedRunsView, LeaseView, QuotaView } from './types';

export class GPUsSidebar extends Widget {
  private _message = '';

  constructor(
    private readonly _poller: Poller,
    private readonly _open: (path: string, cellId: string | null) => void,
    // inserts a cell that runs `code` below the current notebook's active cell; says why it could not
    private readonly _attach: (code: string) => Promise<string | null>
  ) {
    super();
    this.id = 'gpusession-sidebar';
    this.addClass('gs-sidebar');
    this.title.caption = 'GPUs: capacity and your runs';
    _poller.changed.connect((_, snapshot) => this._render(snapshot));
    this._render(_poller.snapshot);
  }

  private _render(snapshot: Snapshot): void {
    // a redraw replaces the controls: keyboard focus goes back to the same one
    const focused = (document.activeElement as HTMLElement | null)?.dataset?.focusKey;
    const status = snapshot.status;
    const parts: Node[] = [el('h2', { class: 'gs-title', text: 'GPUs' })];
    const error = snapshot.error ? `Could not refresh: ${snapshot.error}` : this._message;
    parts.push(el('div', { class: 'gs-error', role: 'alert', text: error, hidden: !error }));
    if (status) {
      parts.push(this._cluster(status.cluster));
      parts.push(this._runs(status.leases, snapshot.finished, snapshot.at));
      if (snapshot.detached) {
        parts.push(this._detached(snapshot.detached, snapshot.at));
      }
      parts.push(this._quota(status.quota));
    } else if (!snapshot.error) {
      parts.push(el('div', { class: 'gs-muted', text: 'Asking the server…' }));
    }
    const fresh = document.createElement('div');
    fresh.append(...parts);
    if (fresh.innerHTML === this.node.innerHTML) {
      return; // nothing a user sees changed: keep the controls under the pointer as they are
    }
    this.node.replaceChildren(...Array.from(fresh.childNodes));
    if (focused) {
      (this.node.querySelector(`[data-focus-key="${focused}"]`) as HTMLElement | null)?.focus();
    }
  }

  private _cluster(cluster: ClusterView): HTMLElement {
    const logical = cluster.logical_gpus ? ' (logical: training runs on CPU)' : '';
    const anyLost = cluster.nodes.some(node => node.lost); // the "lost" column only when a node is
    const rows = cluster.nodes.map(node =>
      el('tr', { class: node.lost ? 'gs-lost' : '' }, [
        el('td', { class: 'gs-node', text: node.node_id.slice(0, 8), title: node.node_id }),
        el('td', { text: String(node.gpus) }),
        el('td', { text: String(node.leased) }),
        el('td', { text: String(node.free) }),
        el('td', { text: String(node.lent) }),
        ...(anyLost ? [el('td', { text: node.lost ? `lost${node.address ? ' ' + node.address : ''}` : '' })] : [])
      ])
    );
    const names = ['node', 'GPUs', 'in use', 'free', 'lent', ...(anyLost ? ['lost'] : [])];
    const head = el('tr', {}, names.map(h => el('th', { text: h })));
    return el('section', { class: 'gs-cluster', 'aria-label': 'cluster capacity' }, [
      el('h3', { text: `Cluster: ${cluster.gpus_free} of ${gpus(cluster.gpus_total)} free${logical}` }),
      el('table', { class: 'gs-table' }, [el('thead', {}, [head]), el('tbody', {}, rows)])
    ]);
  }

  private _runs(open: LeaseView[], finished: LeaseView[], now: number): HTMLElement {
    const active = open.filter(l => l.state !== 'ended').sort((a, b) => a.lease_id - b.lease_id);
    const list = [...active, ...finished].map(l => this._run(l, now));
    return el('section', { class: 'gs-runs', 'aria-label': 'your runs' }, [
      el('h3', { text: `Your runs (${active.length} open)` }),
      list.length ? el('ul', { class: 'gs-run-list' }, list) : el('div', { class: 'gs-muted', text: 'No runs yet.' })
    ]);
  }

  private _run(lease: LeaseView, now: number): HTMLElement {
    const ended = lease.state === 'ended';
    const open = el('button', {
      class: 'gs-link', text: notebookName(lease.notebook), title: lease.notebook || '',
      disabled: !lease.notebook, 'data-focus-key': `open-${lease.lease_id}`,
      onclick: () => lease.notebook && this._open(lease.notebook, lease.cell_id)
    });
    const stop = ended ? '' : el('button', {
      class: 'gs-stop jp-mod-styled jp-mod-warn', text: 'Stop', 'aria-label': `stop lease ${lease.lease_id}`,
      'data-focus-key': `stop-${lease.lease_id}`, onclick: () => void this._stop(lease)
    });
    const facts = `${gpus(lease.gpus)} · ${duration(elapsed(lease, now))} · ${gpuSeconds(lease, now).toFixed(0)} GPU-s`;
    return el('li', { class: `gs-run gs-state-${lease.state}${lease.background ? ' gs-background' : ''}`, 'data-lease': String(lease.lease_id) }, [
      el('div', { class: 'gs-run-head' }, [open, stop]),
      el('div', { class: 'gs-run-state', text: `#${lease.lease_id} ${stateText(lease)}` }),
      el('div', { class: 'gs-muted', text: facts })
    ]);
  }

  private _detached(view: DetachedRunsView, now: number): HTMLElement {
    const live = view.runs.filter(detachedLive).length;
    const body = !view.available
      ? el('div', { class: 'gs-muted', text: view.message || 'Detached runs are not available here.' })
      : view.runs.length
        ? el('ul', { class: 'gs-run-list' }, view.runs.map(run => this._detachedRun(run, now)))
        : el('div', { class: 'gs-muted', text: 'No detached runs. Start one with %%gpu N --bg --detach -o NAME.' });
    return el('section', { class: 'gs-detached', 'aria-label': 'your detached runs' }, [
      el('h3', { text: `Detached runs (${live} live)` }),
      body
    ]);
  }

  private _detachedRun(run: DetachedRunView, now: number): HTMLElement {
    const attach = el('button', {
      class: 'gs-attach jp-mod-styled', text: 'Attach', 'aria-label': `attach run ${run.run_id}`,
      title: `Insert and run: ${attachCode(run)}`, 'data-focus-key': `attach-${run.run_id}`,
      onclick: () => void this._attachTo(run)
    });
    const stop = detachedLive(run) ? el('button', {
      class: 'gs-stop jp-mod-styled jp-mod-warn', text: 'Stop', 'aria-label': `stop run ${run.run_id}`,
      'data-focus-key': `stop-run-${run.run_id}`, onclick: () => void this._stopDetached(run)
    }) : '';
    const facts = `${gpus(run.gpus)} · ${run.reports} report${run.reports === 1 ? '' : 's'} · ${notebookName(run.notebook)}`;
    return el('li', { class: `gs-run gs-detached-run gs-state-${run.state}`, 'data-run': run.run_id }, [
      el('div', { class: 'gs-run-head' }, [
        el('span', { class: 'gs-run-name', text: run.name, title: run.run_id }),
        el('span', { class: 'gs-buttons' }, [attach, stop])
      ]),
      el('div', { class: 'gs-run-state', text: detachedText(run, now) }),
      el('div', { class: 'gs-muted', text: facts })
    ]);
  }

  private async _attachTo(run: DetachedRunView): Promise<void> {
    this._message = (await this._attach(attachCode(run))) || '';
    this._render(this._poller.snapshot);
  }

  private async _stopDetached(run: DetachedRunView): Promise<void> {
    try {
      await api(`runs/${encodeURIComponent(run.run_id)}`, { method: 'DELETE' });
      this._message = '';
    } catch (error) {
      this._message = `Could not stop run ${run.run_id.slice(0, 8)}: ${(error as Error).message}`;
    }
    await this._poller.refresh(true);
  }

  private _quota(quota: QuotaView): HTMLElement {
    const max = quota.max_gpus === null ? 'no limit' : gpus(quota.max_gpus);
    return el('section', { class: 'gs-quota', 'aria-label': 'your quota' }, [
      el('h3', { text: `Quota of ${quota.user}` }),
      el('div', { text: `${gpus(quota.gpus_in_use)} in use of ${max}; priority up to ${quota.max_priority}` }),
      el('div', { text: `${quota.gpu_hours_7d.toFixed(2)} GPU-h this week of ${hours(quota.gpu_hours)}` })
    ]);
  }

  private async _stop(lease: LeaseView): Promise<void> {
    try {
      await api(`leases/${lease.lease_id}`, { method: 'DELETE' });
      this._message = '';
    } catch (error) {
      this._message = `Could not stop lease ${lease.lease_id}: ${(error as Error).message}`;
    }
    await this._poller.refresh();
  }
}
