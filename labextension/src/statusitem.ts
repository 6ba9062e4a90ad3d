// The status bar item for the current notebook: "GPUs: idle", "GPUs: queued #2", "2 GPUs · step 340".
// Its run is the newest open lease asked from that notebook's path; a click opens the sidebar.
import { INotebookTracker } from '@jupyterlab/notebook';
import { Widget } from '@lumino/widgets';

import { statusBarText } from './format';
import { Poller } from './poller';
import { LeaseView } from './types';

export class GPUStatusItem extends Widget {
  constructor(
    private readonly _poller: Poller,
    private readonly _notebooks: INotebookTracker,
    onClick: () => void
  ) {
    super({ node: document.createElement('button') });
    this.addClass('gs-statusitem');
    this.node.title = 'GPU runs of this notebook: click for the GPUs sidebar';
    this.node.addEventListener('click', onClick);
    _poller.changed.connect(() => this._render());
    _notebooks.currentChanged.connect(() => this._render());
    this._render();
  }

  private _render(): void {
    const path = this._notebooks.currentWidget?.context.path;
    const leases = this._poller.snapshot.status?.leases ?? [];
    const mine: LeaseView | undefined = leases
      .filter(l => path && l.notebook === path && l.state !== 'ended')
      .sort((a, b) => b.lease_id - a.lease_id)[0];
    this.node.textContent = statusBarText(mine);
  }
}
