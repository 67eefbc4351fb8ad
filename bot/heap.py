"""The cyclic garbage collector around bulk loads: paused while a large, long-lived structure is built.

Start-up builds the memory's items and indexes: at 100,000 items millions of objects, none of them
garbage. The collector, whose oldest generation is walked each time it has grown by a quarter, went
over the whole growing heap ten times meanwhile: ~1.5 s of a 3-5 s start (``bench/memory_scale.py``).
Paused, it is not; reference counting still frees whatever the load drops, and the collector resumes
where it was once the load is done (``bot.lifecycle.settle_heap`` then freezes what start-up built).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


class Paused:
    """The block's say on what happens when the collector resumes: ``freeze`` what was built."""

    freeze: bool = False


@contextlib.contextmanager
def collector_paused() -> Iterator[Paused]:
    """Run the block without cyclic collections; nested or while already paused, the outermost resumes.

    A block that built much sets ``freeze``: what it built is then frozen (``gc.freeze``: the collector
    never walks it again), else the first collection after it walks all of it at once as young objects,
    0.3 s at 100,000 items. Only what is part of a cycle needs the collector, and items, indexes and
    vectors hold none; reference counting frees them when they are dropped. (A small load is not
    frozen: freezing takes the rest of the heap along, cycles included, for little gain.)
    """
    was_enabled = gc.isenabled()
    paused = Paused()
    gc.disable()
    try:
        yield paused
    finally:
        if was_enabled:
            if paused.freeze:
                gc.freeze()
            gc.enable()
