"""The privileged launcher (issue 28): under `gpusession hub`, root starts one per node; it is
the warm parent of that node's rank processes (run/node/zygote.py's loop, torch imported) and each
child it forks drops to the Unix account of the user the service verified before it runs
anything. As slurmstepd is to slurmd: small, separate, holding no secret.

- policy.py  PURE: who may be launched (uid floor, root, the service account, their groups) and who may connect
- limits.py  PURE: the resource limits limits.conf gives a user, decided as pam_limits decides
- userlimits.py reads those files for an account; sets the limits in the child, still root
- drop.py    in the forked child, as root: become the user (groups, gid, uid, HOME, umask, cwd)
- cgroups.py one cgroup per rank: nothing a rank started outlives it; GPU device files
- gate.py    what the warm parent does with each request when it runs as root (zygote.Gate)
- __main__.py `python -m gpusession.launcher --dir D --service-user S --min-uid N` (root)
"""
