"""A message with more raw frames than one message may carry (frames.MAX_PAYLOAD_FRAMES): a call
or a result with many big arrays (a model's state_dict has hundreds). The message says how many
frames it has in all ("frames": N) and carries the first ones; `more` messages right after it
carry the rest, in order. Frames are sent as they are: no copy, no concatenation."""
from __future__ import annotations

from .frames import MAX_PAYLOAD_FRAMES, Connection, FrameError, Message
from .kinds import Kind

MAX_FRAMES = 1 << 16  # arrays in one call or one result; the object store bounds the bytes


def send_chunked(conn: Connection, kind: Kind, frames: list, **fields) -> None:
    """Send `kind` with every frame in `frames` (its own message first, then `more` messages).
    Only the thread that sends this message may send on conn until it returns."""
    conn.send(kind, frames[:MAX_PAYLOAD_FRAMES], frames=len(frames), **fields)
    for at in range(MAX_PAYLOAD_FRAMES, len(frames), MAX_PAYLOAD_FRAMES):
        conn.send(Kind.MORE, frames[at:at + MAX_PAYLOAD_FRAMES])


def gather(conn: Connection, message: Message) -> Message:
    """The message with every frame it announced (read from the `more` messages that follow it);
    FrameError for a count that is not a whole number within bounds, or anything else between."""
    total = message.fields.pop("frames", len(message.payload))
    if isinstance(total, bool) or not isinstance(total, int) or not len(message.payload) <= total <= MAX_FRAMES:
        raise FrameError(f"a {message.kind[:40]!r} message announcing {total!r} frames")
    while len(message.payload) < total:
        more = conn.receive()
        if more.kind != Kind.MORE or not more.payload or len(message.payload) + len(more.payload) > total:
            raise FrameError(f"a {more.kind[:40]!r} message where the rest of {message.kind[:40]!r} was due")
        message.payload.extend(more.payload)
    return message
