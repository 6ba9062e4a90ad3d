// What the REST API answers (only the fields the panels read).

export interface NodeView {
  node_id: string;
  gpus: number;
  leased: number;
  lent: number;
  free: number;
  unmanaged: number;
  lost: boolean;
  address: string | null;
}

export interface ClusterView {
  gpus_total: number;
  gpus_leased: number;
  gpus_free: number;
  gpus_lost: number;
  logical_gpus: boolean;
  nodes: NodeView[];
  requests_queued: number;
}

export interface LeaseView {
  lease_id: number;
  user: string;
  gpus: number;
  state: 'queued' | 'granted' | 'placed' | 'ended';
  priority: string;
  over_quota: boolean;
  requested_at: number;
  granted_at: number | null;
  released_at: number | null;
  age_s: number | null;
  position: number | null;
  reason: string | null;
  end_reason: string | null;
  gpu_seconds: number | null;
  notebook: string | null;
  cell_id: string | null;
  step: number | null;
  sweep_id: string | null;
  background: boolean; // asked by a background run (train.submit, %%gpu --bg)
}

export interface QuotaView {
  user: string;
  max_gpus: number | null;
  gpu_hours: number | null;
  max_priority: string;
  is_default: boolean;
  gpus_in_use: number;
  gpu_hours_7d: number;
}

export interface StatusView {
  user: string;
  cluster: ClusterView;
  quota: QuotaView;
  leases: LeaseView[];
}

export interface WhoAmI {
  user: string;
  admin: boolean;
}

export interface UsageRow {
  user: string;
  day: string;
  gpu_seconds: number;
}

export interface DetachedRunView {
  run_id: string;
  name: string;
  state: string; // submitted, queued, starting, running, finished, failed, cancelled
  gpus: number;
  workers: number;
  started: number;
  ended: number | null;
  expires: number;
  end_reason: string | null;
  max_duration: number;
  reports: number;
  notebook: string | null;
}

export interface DetachedRunsView {
  available: boolean; // false where no gateway hosts detached runs (then `message` says why)
  message?: string;
  runs: DetachedRunView[];
}
