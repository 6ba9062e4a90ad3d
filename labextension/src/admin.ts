// The admin panel as a Lab main-area widget: everyone's live leases with revoke, the quota table,
// and GPU-hours per user per day (Chart.js, bundled). Same REST API and checks as the admin page.
import { Widget } from '@lumino/widgets';
import { Chart, registerables } from 'chart.js';

import { api } from './api';
import { el } from './dom';
import { duration, gpus, notebookName, stateText } from './format';
import { renderQuotas } from './quotas';
import { LeaseView, QuotaView, UsageRow } from './types';

Chart.register(...registerables);
const REFRESH_MS = 1000;
const CHART_DAYS = 14;
const COLORS = ['#1976d2', '#ef6c00', '#388e3c', '#7b1fa2', '#c2185b', '#0097a7', '#afb42b', '#5d4037'];

export class AdminPanel extends Widget {
  private _banner = el('div', { class: 'gs-error', role: 'alert' });
  private _leases = el('tbody');
  private _quotas = el('tbody');
  private _canvas = el('canvas', { 'aria-label': 'GPU-hours per user per day' });
  private _chart: Chart | null = null;
  private _chartKey = '';
  private _timer = 0;

  constructor() {
    super();
    this.id = 'gpusession-admin';
    this.addClass('gs-admin');
    this.title.label = 'GPU admin';
    this.title.closable = true;
    const head = (names: string[]) => el('thead', {}, [el('tr', {}, names.map(n => el('th', { text: n })))]);
    this.node.append(
      el('h2', { text: 'gpusession admin' }), this._banner,
      el('h3', { text: 'Live leases' }),
      el('table', { class: 'gs-table gs-leases' }, [head(['lease', 'user', 'GPUs', 'state', 'age', 'notebook', '']), this._leases]),
      el('h3', { text: 'Quotas' }),
      el('table', { class: 'gs-table gs-quotas' }, [
        head(['user', 'max GPUs', 'GPU-hours / 7 days', 'max priority', 'in use', 'used (7 days, h)', '']), this._quotas]),
      el('h3', { text: `GPU-hours per day (last ${CHART_DAYS} days)` }),
      el('div', { class: 'gs-chart' }, [this._canvas])
    );
    this._timer = window.setInterval(() => void this.refresh(), REFRESH_MS);
    void this.refresh();
  }

  dispose(): void {
    window.clearInterval(this._timer);
    this._chart?.destroy();
    super.dispose();
  }

  async refresh(): Promise<void> {
    const since = Date.now() / 1000 - CHART_DAYS * 86400;
    try {
      const [leases, quotas, usage] = await Promise.all([
        api<LeaseView[]>('leases'), api<QuotaView[]>('quotas'), api<UsageRow[]>(`usage?by=day&since=${since}`)
      ]);
      this._banner.textContent = '';
      this._renderLeases(leases);
      renderQuotas(this._quotas, quotas, () => void this.refresh());
      this._renderChart(usage);
    } catch (e) {
      this._banner.textContent = `Could not refresh: ${(e as Error).message}`;
    }
  }

  private _renderLeases(leases: LeaseView[]): void {
    const rows = leases.filter(l => l.state !== 'ended').map(l => el('tr', { 'data-lease': String(l.lease_id) }, [
      el('td', { text: String(l.lease_id) }), el('td', { text: l.user }), el('td', { text: gpus(l.gpus) }),
      el('td', { text: stateText(l) }), el('td', { text: duration(l.age_s) }), el('td', { text: notebookName(l.notebook) }),
      el('td', {}, [el('button', {
        class: 'jp-mod-styled jp-mod-warn', text: 'Revoke', 'aria-label': `revoke lease ${l.lease_id}`,
        onclick: () => void this._revoke(l.lease_id)
      })])
    ]));
    this._leases.replaceChildren(...(rows.length ? rows : [el('tr', {}, [el('td', { colspan: '7', text: 'No live leases.' })])]));
  }

  private async _revoke(leaseId: number): Promise<void> {
    try {
      await api(`leases/${leaseId}`, { method: 'DELETE' });
    } catch (e) {
      this._banner.textContent = `Could not revoke lease ${leaseId}: ${(e as Error).message}`;
      return;
    }
    await this.refresh();
  }

  private _renderChart(rows: UsageRow[]): void {
    const days = [...Array(CHART_DAYS).keys()].map(i => new Date(Date.now() - (CHART_DAYS - 1 - i) * 86400000).toISOString().slice(0, 10));
    const users = [...new Set(rows.map(r => r.user))].sort();
    const datasets = users.map((user, i) => ({
      label: user, backgroundColor: COLORS[i % COLORS.length],
      data: days.map(d => rows.filter(r => r.user === user && r.day === d).reduce((s, r) => s + r.gpu_seconds / 3600, 0))
    }));
    const key = JSON.stringify(datasets.map(d => [d.label, d.data]));
    if (key === this._chartKey) {
      return;
    }
    this._chartKey = key;
    this._chart?.destroy();
    const color = getComputedStyle(this.node).getPropertyValue('--jp-ui-font-color1').trim() || '#666';
    this._chart = new Chart(this._canvas, {
      type: 'bar',
      data: { labels: days, datasets },
      options: {
        animation: false, responsive: true, maintainAspectRatio: false, color,
        scales: { x: { stacked: true, ticks: { color } }, y: { stacked: true, ticks: { color }, title: { display: true, text: 'GPU-hours', color } } }
      }
    });
  }
}
