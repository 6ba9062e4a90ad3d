"""What a user's code calls on the caller's side (gs.distributed, gs.lease, Run, gs.attach,
gs.status): each picks this process's own lease or the hub's gateway."""
