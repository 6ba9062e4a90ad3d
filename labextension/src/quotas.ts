// The admin panel's quota table: each row edited in place and saved with Save or Enter. A refused
// save keeps what the admin typed and shows the server's message on that row; the table keeps
// refreshing the other rows meanwhile.
import { api, jsonBody } from './api';
import { el } from './dom';
import { gpus } from './format';
import { QuotaView } from './types';

const PRIORITIES = ['low', 'normal', 'high'];

function numberInput(value: number | null, label: string): HTMLInputElement {
  return el('input', {
    type: 'number', min: '0', step: 'any', placeholder: 'no limit', 'aria-label': label,
    value: value === null || value === undefined ? '' : String(value)
  });
}

/** The input as the API takes it: empty is "no limit" (null); anything else goes as typed, so the
 * server refuses a bad value in words (a browser reports unparsable input as "", kept as text). */
function inputValue(input: HTMLInputElement): number | string | null {
  if (input.value.trim() === '') {
    return input.validity.badInput ? 'not a number' : null;
  }
  return Number(input.value);
}

export function quotaRow(quota: QuotaView, saved: () => void): HTMLTableRowElement {
  const maxGpus = numberInput(quota.max_gpus, `max GPUs of ${quota.user}`);
  const hours = numberInput(quota.gpu_hours, `GPU-hours of ${quota.user}`);
  const priority = el('select', { 'aria-label': `max priority of ${quota.user}` },
    PRIORITIES.map(p => el('option', { value: p, text: p, selected: p === quota.max_priority })));
  const error = el('div', { class: 'gs-error', role: 'alert' });
  const save = el('button', { class: 'jp-mod-styled jp-mod-accept', text: 'Save', 'aria-label': `save quota of ${quota.user}` });
  const row = el('tr', { 'data-user': quota.user }, [
    el('td', {}, [quota.user, error]),
    el('td', {}, [maxGpus]), el('td', {}, [hours]), el('td', {}, [priority]),
    el('td', { text: gpus(quota.gpus_in_use) }), el('td', { text: quota.gpu_hours_7d.toFixed(2) }),
    el('td', {}, [save])
  ]);
  const submit = async () => {
    error.textContent = '';
    const body = { max_gpus: inputValue(maxGpus), gpu_hours: inputValue(hours), max_priority: priority.value };
    try {
      const answer = await api<QuotaView>(`quotas/${encodeURIComponent(quota.user)}`, { method: 'PUT', ...jsonBody(body) });
      row.replaceWith(quotaRow(answer, saved));
      saved();
    } catch (e) {
      row.classList.add('gs-dirty');
      error.textContent = (e as Error).message;
    }
  };
  for (const input of [maxGpus, hours, priority]) {
    input.addEventListener('input', () => row.classList.add('gs-dirty'));
    input.addEventListener('keydown', event => (event as KeyboardEvent).key === 'Enter' && void submit());
  }
  save.addEventListener('click', () => void submit());
  return row;
}

/** Fresh rows replace the table's, except one being edited (unsaved or refused): it stays as typed. */
export function renderQuotas(body: HTMLElement, quotas: QuotaView[], saved: () => void): void {
  const kept = new Map<string, Element>();
  body.querySelectorAll('tr[data-user]').forEach(row => {
    if (row.classList.contains('gs-dirty') || row.contains(document.activeElement)) {
      kept.set((row as HTMLElement).dataset.user as string, row);
    }
  });
  body.replaceChildren(...quotas.map(q => kept.get(q.user) || quotaRow(q, saved)));
}
