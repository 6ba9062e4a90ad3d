"""What runs after a module in this session's order (random or not): how a module-scoped service
(a hub, a gateway host, simulated hosts) knows whether to stay up for a later module or stop now,
so that none is left idle while the session's last modules run."""
from __future__ import annotations


def items_after_module(request) -> list:
    """The session's test items after the last one of `request`'s module."""
    items = request.session.items
    last = max((i for i, item in enumerate(items) if getattr(item, "module", None) is request.module),
               default=len(items))
    return items[last + 1:]


def takes(item, fixture: str) -> bool:
    return fixture in getattr(item, "fixturenames", ())
