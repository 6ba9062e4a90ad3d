"""`gpusession hub`: a JupyterHub on one machine, each user's server as that Unix user, with the
Ray head and the broker run by one service account (see docs/getting-started/team.md and docs/admin/hub.md)."""
