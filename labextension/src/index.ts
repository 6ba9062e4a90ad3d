// gpusession in JupyterLab: the "GPUs" sidebar, a status bar item per notebook, and for admins
// only, the admin panel (palette and launcher). Non-admins never get the command: it is added
// only after the server says the caller is an admin.
import { ILabShell, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette, MainAreaWidget } from '@jupyterlab/apputils';
import { ILauncher } from '@jupyterlab/launcher';
import { INotebookTracker, NotebookActions } from '@jupyterlab/notebook';
import { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon } from '@jupyterlab/ui-components';

import { AdminPanel } from './admin';
import { api } from './api';
import { Poller } from './poller';
import { GPUsSidebar } from './sidebar';
import { GPUStatusItem } from './statusitem';
import { WhoAmI } from './types';

const ADMIN_COMMAND = 'gpusession:open-admin';
const gpuIcon = new LabIcon({
  name: 'gpusession:gpu',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" width="16" viewBox="0 0 24 24"><g class="jp-icon3" fill="#616161">' +
    '<path d="M3 7h18v10H3zM5 9v6h6V9zm8 0v2h6V9zm0 4v2h6v-2zM6 4h2v3H6zm5 0h2v3h-2zm5 0h2v3h-2zM6 17h2v3H6zm5 0h2v3h-2zm5 0h2v3h-2z"/>' +
    '</g></svg>'
});

function addAdmin(app: JupyterFrontEnd, palette: ICommandPalette | null, launcher: ILauncher | null): void {
  let panel: MainAreaWidget<AdminPanel> | null = null;
  app.commands.addCommand(ADMIN_COMMAND, {
    label: 'GPU admin',
    caption: 'Quotas, everyone\'s leases and GPU-hours (gpusession admins)',
    icon: gpuIcon,
    execute: () => {
      if (!panel || panel.isDisposed) {
        panel = new MainAreaWidget({ content: new AdminPanel() });
        panel.id = 'gpusession-admin-panel';
        panel.title.label = 'GPU admin';
        panel.title.icon = gpuIcon;
        app.shell.add(panel, 'main');
      }
      app.shell.activateById(panel.id);
    }
  });
  palette?.addItem({ command: ADMIN_COMMAND, category: 'gpusession' });
  launcher?.add({ command: ADMIN_COMMAND, category: 'Other', rank: 50 });
}

/** Open a run's notebook and select the cell that started it (when the lease names one). */
async function openAt(app: JupyterFrontEnd, notebooks: INotebookTracker, path: string, cellId: string | null) {
  const widget = await app.commands.execute('docmanager:open', { path });
  const panel = notebooks.find(candidate => candidate === widget) ?? null;
  if (!panel || !cellId) {
    return;
  }
  await panel.context.ready;
  const index = panel.content.widgets.findIndex(cell => cell.model.id === cellId);
  if (index >= 0) {
    panel.content.activeCellIndex = index;
    await panel.content.scrollToItem(index);
  }
}

/** Insert a code cell running `code` below the current notebook's active cell, and run it. */
async function insertAndRun(app: JupyterFrontEnd, notebooks: INotebookTracker, code: string): Promise<string | null> {
  const panel = notebooks.currentWidget;
  if (!panel) {
    return `Open a notebook first: Attach adds a cell with \`${code}\` to the current one.`;
  }
  await panel.context.ready;
  const notebook = panel.content;
  NotebookActions.insertBelow(notebook);
  NotebookActions.changeCellType(notebook, 'code');
  const cell = notebook.activeCell;
  if (!cell) {
    return 'The notebook has no active cell to attach below.';
  }
  cell.model.sharedModel.setSource(code);
  app.shell.activateById(panel.id);
  await NotebookActions.run(notebook, panel.sessionContext);
  return null;
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'gpusession-lab:plugin',
  description: 'GPUs sidebar, status bar item and admin panel for gpusession',
  autoStart: true,
  requires: [ILabShell, INotebookTracker],
  optional: [IStatusBar, ICommandPalette, ILauncher],
  activate: (app: JupyterFrontEnd, shell: ILabShell, notebooks: INotebookTracker, statusBar: IStatusBar | null,
    palette: ICommandPalette | null, launcher: ILauncher | null) => {
    const poller = new Poller();
    const sidebar = new GPUsSidebar(poller, (path, cellId) => void openAt(app, notebooks, path, cellId),
      code => insertAndRun(app, notebooks, code));
    sidebar.title.icon = gpuIcon;
    shell.add(sidebar, 'left', { rank: 300 });
    statusBar?.registerStatusItem('gpusession-lab:status', {
      item: new GPUStatusItem(poller, notebooks, () => shell.activateById(sidebar.id)),
      align: 'left',
      rank: 5,
      isActive: () => !!notebooks.currentWidget && shell.currentWidget === notebooks.currentWidget
    });
    poller.start();
    api<WhoAmI>('whoami')
      .then(me => {
        if (me.admin) {
          addAdmin(app, palette, launcher);
        }
        sidebar.node.dataset.role = me.admin ? 'admin' : 'user'; // set once the role is known
      })
      .catch(error => console.warn(`gpusession: could not ask who you are: ${error.message}`));
  }
};

export default plugin;
