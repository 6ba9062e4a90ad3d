"""Big data in and out (issue 33): a 400 MB tensor argument to a 2-rank call on one node, and a
400 MB tensor returned by rank 0, against Ray's own way: `ray.put` once and 2 long-lived actors
(one logical GPU each) reading it; an actor returning the tensor through the object store.

    .venv/bin/python benchmarks/data_transfer.py [--samples 6] [--mb 400] [--big-mb 2000]

Both sides are warm (one discarded round each first) and alternated, the order flipped every
round. A gpusession sample is one call (lease, ranks, the data in, the function, release); a Ray
sample is the put and both actors' reads (or one actor's return and the get). The caller's peak
growth of its own memory (RssAnon: not the object store's shared pages) is sampled every 5 ms.
Last, one call with a --big-mb argument shows it goes through. Writes
benchmarks/results/data_transfer.json.
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from _cluster import local_cluster  # noqa: E402
from _results import Row, spread, write  # noqa: E402

MB = 1_000_000


def anonymous_mb() -> float:
    with open("/proc/self/status") as status:
        return int(next(line for line in status if line.startswith("RssAnon:")).split()[1]) / 1024


class Peak:
    def __enter__(self):
        self.start = self.peak = anonymous_mb()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._done.wait(0.005):
            self.peak = max(self.peak, anonymous_mb())

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()


def sides(mb: int):
    import ray
    import torch

    import gpusession as gs
    from gpusession.observe import events

    events.set_observer_factory(lambda world_size: events.Observer())
    elements = mb * MB // 4

    @gs.distributed(gpus=2)
    def consume(tensor):
        return float(tensor[-1])

    @gs.distributed(gpus=2)
    def produce(n):
        import torch as t

        return t.ones(n) if gs.context().rank == 0 else None

    @ray.remote(num_gpus=1)
    class Reader:
        def consume(self, tensor):
            return float(tensor[-1])

        def produce(self, n):
            import torch as t

            return t.ones(n)

    readers = [Reader.remote() for _ in range(2)]
    ray.get([r.consume.remote(torch.ones(1)) for r in readers])  # both actors up

    def timed(fn):
        started = time.perf_counter()
        with Peak() as peak:
            fn()
        return time.perf_counter() - started, peak.peak - peak.start

    def gs_in():
        data = torch.ones(elements)
        return timed(lambda: consume(data))

    def ray_in():
        data = torch.ones(elements)
        return timed(lambda: _both(readers, data))

    def gs_out():
        return timed(lambda: produce(elements))

    def ray_out():
        return timed(lambda: ray.get(readers[0].produce.remote(elements)))

    return {"in": (gs_in, ray_in), "out": (gs_out, ray_out)}, consume


def _both(readers, data):
    import ray

    ref = ray.put(data)  # once
    return ray.get([r.consume.remote(ref) for r in readers])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=6)
    parser.add_argument("--mb", type=int, default=400)
    parser.add_argument("--big-mb", type=int, default=2000, help="one call with an argument this big (0: none)")
    args = parser.parse_args()
    load_before = os.getloadavg()
    with local_cluster():
        pairs, consume = sides(args.mb)
        for mine, theirs in pairs.values():  # warm-up, discarded
            mine()
            theirs()
        measured = {key: ([], [], [], []) for key in pairs}
        for round_ in range(args.samples):
            for key, (mine, theirs) in pairs.items():
                order = (mine, theirs) if round_ % 2 == 0 else (theirs, mine)
                for fn in order:
                    seconds, grew = fn()
                    index = 0 if fn is mine else 1
                    measured[key][index].append(seconds)
                    measured[key][index + 2].append(grew)
        big = None
        if args.big_mb:
            import numpy

            data = numpy.ones(args.big_mb * MB // 8)
            started = time.perf_counter()
            consume(data)
            big = time.perf_counter() - started
            shipped = consume.last_run.receipt()
    configured = ("one node, 4 logical GPUs; gpusession: a @gs.distributed(gpus=2) call per sample; Ray: 2 long-lived "
                  "actors (num_gpus=1), ray.put once per sample; both warm, alternated, order flipped each round")
    rows = [
        Row(f"{args.mb} MB tensor argument to 2 ranks", "s", measured["in"][0],
            "ray.put once + 2 long-lived actors reading it", measured["in"][1], configured, "<= 1.5x"),
        Row(f"{args.mb} MB tensor result", "s", measured["out"][0],
            "an actor returning it through the object store", measured["out"][1], configured, "<= 1.5x"),
        Row(f"caller's own memory growth, {args.mb} MB argument", "MB", measured["in"][2],
            "the same for ray.put", measured["in"][3], configured, f"<= {0.5 * args.mb:g} MB (1.5x the data in all)"),
    ]
    if big is not None:
        rows.append(Row(f"a {args.big_mb} MB argument to 2 ranks (works)", "s", [big], configured=configured,
                        note=shipped, samples_note="one call: the row shows that an argument this big goes "
                        "through, and its receipt; the timing rows are the ones above"))
    for row in rows:
        print(f"{row.measure}: gpusession {spread(row.gpusession_samples)}, {row.alternative or '-'} "
              f"{spread(row.alternative_samples) if row.alternative_samples else ''}")
    write("data_transfer", rows, loadavg_before=load_before)


if __name__ == "__main__":
    main()
