"""The gateway: the one door through which kernels and Jupyter servers reach gpusession when a
service runs it for several users (`gpusession hub`).

A user's server and kernels hold no Ray address or token: they connect to the gateway's Unix
socket, the kernel itself names the caller (SO_PEERCRED), and the service acts for that user.
A user's functions, arguments and results cross the gateway as opaque bytes.

For one user (`gpusession lab`, RAY_ADDRESS) calls run in the kernel's own process, and the same
gateway process, run as that user (usergateway.py), hosts only their detached runs.

    frames.py   how messages travel: a JSON header frame, then raw byte frames (never a pickle)
    peer.py     who is on the other end of a connection (uid from the kernel, name from passwd)
    server.py   the service's side: accept, learn the peer, hand the connection to its handler
    acting.py   how the service acts for a caller at the broker (signed name, admin token)
    client.py   the caller's side: connect, say hello, send and receive messages
    runwire.py  PURE: the run session's JSON (options re-validated, RunInfo, events, errors by name)
    runrequest.py PURE: the run session's requests checked field by field (a call, a run, a lease)
    remote.py   the run session, kernel's side: pickle, send, render events, unpickle the result
    hosted.py   the run session, service's side: the one run path (Lease, controller) for a caller
    following.py  a hosted run and its kernel: its stop and death, its events, its end told
    heldlease.py  gs.lease through the gateway, service's side: a lease held while the connection lives
    remotelease.py  gs.lease through the gateway, kernel's side: the lease object a hub kernel holds
    shelf.py    the checkpoints hosted runs left, per account, under handles
    keeping.py  PURE: detached runs' rules: time limit, retention, result cap, who may see or cancel
    detached.py the detached runs the gateway hosts past their kernels, per account, in memory
    following.py which processes follow a live run, per account (a server's kernels count as active)
    reattach.py detached runs, kernel's side: list, attach (replay then live), cancel
    chunks.py   a message with more raw frames than one message carries
    intake.py   the bytes of calls each account may hold in the gateway's memory at a time
    brokercalls.py    PURE: the broker session's methods, request checks, the broker call it makes
    brokersession.py  the service's side of the "broker" session (status, quotas, the admin page's calls)
    brokerclient.py   the caller's side of it: no Ray, no credentials (servers, kernels, the CLI)
    main.py           the gateway process (`python -m gpusession.gateway.main`), a Ray driver of the service
                      (or, with --user, of one user's cluster, as that user)
    process.py        start and stop that process (the hub's cluster service does)
    usergateway.py    a user's own gateway, the caller's side: where it lives per cluster, find, start on a detach
"""
