"""Relevant memory: the items a query finds, by its words and its meaning, and the pack that fits a budget.

Words come from the retriever's index; meaning, when an embedder is configured, from the vector store,
which brings in up to :data:`SEMANTIC_CANDIDATES` items the words missed. In chat scope a chat's query
sees only that chat's items. :meth:`RelevantMemory.pack` turns the ranking into the
``## Relevant Memory`` section.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from collections.abc import Set as AbstractSet
from datetime import datetime
from itertools import islice
from zoneinfo import ZoneInfo

from bot.config import MemorySettings
from bot.memory.asks import asks_about_assistant
from bot.memory.item_index import embeddable
from bot.memory.item_store import ItemStore
from bot.memory.items import Layer, MemoryItem, ScoredItem
from bot.memory.lexical import Where
from bot.memory.memories import Memory, MessageKey
from bot.memory.pack import MemoryPack, assemble, overhead, price, said_in
from bot.memory.recall import Recaller
from bot.memory.retrieval import Retriever, diversify
from bot.memory.scope import belongs_to
from bot.memory.vector_search import Feedback
from bot.memory.vectors import VectorStore

SEMANTIC_CANDIDATES = 100  # items the embedding signal brings in, beyond what the words found


class RelevantMemory:
    """Ranks items for a query (:meth:`search`) and packs the best into a token budget (:meth:`pack`).

    Items used in a pack, or in a search that asks for it, are touched: an item in use does not
    decay. ``vectors`` is ``None`` without an embedder; the words alone rank then.
    """

    def __init__(
        self,
        items: ItemStore,
        retriever: Retriever,
        recaller: Recaller,
        vectors: VectorStore | None,
        settings: MemorySettings,
        *,
        tz: ZoneInfo,
        clock: Callable[[], datetime],
        chat_scope: bool,
    ) -> None:
        self._items = items
        self._retriever = retriever
        self._recaller = recaller
        self._vectors = vectors
        self._settings = settings
        self._tz = tz
        self._clock = clock
        self._chat_scope = chat_scope

    async def search(
        self,
        query: str,
        *,
        k: int = 10,
        layers: Sequence[Layer] | None = None,
        touch: bool = False,
        session_id: str | None = None,
    ) -> list[ScoredItem]:
        """The ``k`` best items for ``query`` (one per source message), best first.

        In chat scope only ``session_id``'s items are searched; ``None`` (the operator) searches all.
        """
        ranked = await self._rank(query, session_id)
        if layers is not None:
            ranked = [s for s in ranked if s.item.layer in layers]
        out = list(islice(diversify(ranked), k))
        if touch:
            await self._touch(out)
        return out

    def prefetch(self, query: str) -> None:
        """Start the work for ``query`` that can go ahead of its turn (the query's vector), without
        waiting for it. A turn that then asks for the same text finds it made or in the making."""
        if self._vectors is not None:
            self._vectors.prefetch(query)

    async def _rank(
        self,
        query: str,
        session_id: str | None,
        now: datetime | None = None,
        *,
        askers: Mapping[str, str] | None = None,
    ) -> list[ScoredItem]:
        await self._retriever.ready()
        visible = self._visible(session_id)
        # In chat scope candidates are drawn from the chat's own items, so that others' matches never
        # crowd them out of the best: named when they are the fewer, else asked about (Where).
        own: AbstractSet[str] | Where | None = None
        if visible is not None and session_id is not None:
            mine = self._items.index.of_session(session_id)
            own = mine if len(mine) * 2 < len(self._items) else Where(mine.__contains__)
        now = now or self._clock()
        if self._vectors is not None:
            self._vectors.prefetch(query)  # the model starts on the query in its thread, as words count
            await asyncio.sleep(0)  # (its task hands the text to the model's thread)
        matched = self._retriever.match_words(
            query, now, visible=visible, tz=self._tz, only=own, askers=askers
        )
        similarities = await self._similarities(query, visible, own) if self._vectors is not None else None
        return self._retriever.rank(
            query, now, visible=visible, similarities=similarities, tz=self._tz, matched=matched
        )

    def _visible(self, session_id: str | None) -> Callable[[MemoryItem], bool] | None:
        """What ``session_id`` may see: in chat scope its own items ("" (no chat) none, None (the
        operator) all); ``None``: everything."""
        if not self._chat_scope or session_id is None:
            return None
        return lambda item: belongs_to(item, session_id)

    def embed_later(self, old: MemoryItem | None, new: MemoryItem | None) -> None:
        """Every new or changed item is queued for its vector (the store skips what it has); an item
        store listener."""
        if self._vectors is not None and new is not None and embeddable(new):
            self._vectors.submit([new])

    async def _similarities(
        self,
        query: str,
        visible: Callable[[MemoryItem], bool] | None,
        own: AbstractSet[str] | Where | None,
    ) -> dict[str, float]:
        """Cosine similarity of the query with the items nearest to it in meaning (among ``own``'s, when
        given), by item id."""
        assert self._vectors is not None
        usable = None
        if visible is not None:
            usable = lambda f: any(visible(i) for i in self._items.index.with_fingerprint(f))  # noqa: E731
        feedback = Feedback(usable=usable)
        among = None
        if isinstance(own, AbstractSet):
            among = {item.fingerprint for i in own if (item := self._items.get(i)) is not None}
        admits = usable if isinstance(own, Where) else None
        out: dict[str, float] = {}
        nearest = await self._vectors.nearest(
            query, SEMANTIC_CANDIDATES, among, feedback=feedback, admits=admits
        )
        for fingerprint, score in nearest:
            for item in self._items.index.with_fingerprint(fingerprint):
                if visible is None or visible(item):
                    out[item.id] = score
        return out

    async def _touch(self, chosen: Sequence[ScoredItem]) -> None:
        """Remember use in memory only; the next write of the item persists it (no write per query)."""
        self._items.touch_many((scored.item.id for scored in chosen), self._clock())

    async def pack(
        self,
        query: str,
        *,
        soft: int | None = None,
        hard: int | None = None,
        session_id: str | None = None,
        now: datetime | None = None,
        skip: Collection[MessageKey] = (),
        askers: Mapping[str, str] | None = None,
    ) -> MemoryPack:
        """The ``## Relevant Memory`` section for ``query``: the most relevant memories that fit the budget,
        leaving out the messages in ``skip`` (those the prompt already shows). ``askers``: in a group, the
        turn's senders by id, each with what they wrote: whose own statements "my job" means."""
        s = self._settings
        started = time.perf_counter()
        hard = s.pack_hard_tokens if hard is None else hard
        soft = min(hard, s.pack_soft_tokens if soft is None else soft)
        base = overhead(self._recaller.count)
        ranked = await self._rank(query, session_id, now, askers=askers)
        memories, skipped = self._recaller.gather(ranked, skip=set(skip))
        here = session_id if askers else None  # a group's turn: what other chats said is marked so

        def cost(memory: Memory) -> int:
            if here is not None and (chat := said_in(memory)) and chat != here:
                memory.elsewhere = chat
            return price(memory, self._recaller.count, self._tz)

        recall = self._recaller.select(
            memories,
            soft=max(0, soft - base),
            hard=max(0, hard - base),
            floor=s.recall_floor,
            cost=cost,
            brief_assistant=not asks_about_assistant(query),
            restates=lambda item: self._retriever.restates(item, query),
            visible=self._visible(session_id),
        )
        recall.diagnostics.skipped_shown = skipped
        pack = assemble(recall, hard=hard, count=self._recaller.count, tz=self._tz, query=query)
        pack.diagnostics.soft_budget = soft
        pack.diagnostics.embeddings = self._vectors is not None
        await self._touch(pack.items)
        pack.diagnostics.ms = round((time.perf_counter() - started) * 1000, 2)
        return pack
