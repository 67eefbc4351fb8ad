"""Words: how text becomes search terms, for the index and for queries alike.

Lower-cased word tokens of any script without English stop words, each reduced to its dictionary lemma
(simplemma: "bought" -> "buy", "older" -> "old") and then through a light suffix stripper, so the words a
user asks with meet the words they used. Chinese and Japanese, written without spaces, become
overlapping character pairs.

simplemma is imported at the first word looked up (``load_lemmas`` at the start of memory's read path):
a bot with memory off, which looks up none, does not hold it (4 MiB).
"""

from __future__ import annotations

import re
from functools import lru_cache

_TOKEN = re.compile(r"[^\W_]+")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
STOPWORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before being below
    between both but by can could did do does doing down during each few for from further had has have having
    he her here hers herself him himself his how i if in into is it its itself just me more most my myself no
    nor not now of off on once only or other our ours ourselves out over own same she should so some such than
    that the their theirs them themselves then there these they this those through to too under until up very
    was we were what when where which while who whom why will with would you your yours yourself yourselves
    s t d ll m re ve also get got im ive id dont let lets can cant could would many much total""".split()  # noqa: SIM905
)


def stem(token: str) -> str:
    """A deliberately light suffix stripper (plurals, -ing, -ed, final e), so "bikes", "bike" and
    "biking" meet. Both queries and items go through it, so only consistency matters, not grammar."""
    if len(token) <= 3 or token.isdigit():
        return token
    if token.endswith("ies"):
        token = token[:-3] + "y"
    elif token.endswith("sses"):
        token = token[:-2]
    elif token.endswith("s") and token[-2] not in "sui":
        token = token[:-1]
    for suffix in ("ing", "ed"):
        if token.endswith(suffix) and len(token) - len(suffix) >= 3:
            token = token[: -len(suffix)]
            if len(token) > 3 and token[-1] == token[-2] and token[-1] not in "lsz":
                token = token[:-1]  # running -> run
            break
    if len(token) > 3 and token.endswith("e"):
        token = token[:-1]
    return token


@lru_cache(maxsize=65536)
def normalize_word(word: str) -> str:
    """The lemma of an English word, then stemmed; words of other languages pass through unchanged.

    simplemma's ``low_memory`` backend reads the same dictionary as a front-coded stream, decoding the
    few entries a look-up needs: the same lemmas, 2 MiB resident instead of the 19 MiB dict the default
    backend unpacks, for ~9 µs more per look-up (and this cache spares most of them)."""
    import simplemma  # here, not at the top: see the module doc

    return stem(simplemma.lemmatize(word, lang="en", low_memory=True).lower())


def load_lemmas() -> None:
    """Read the English lemma dictionary now (blocking, ~0.1 s): call it off the event loop at start."""
    normalize_word("warming")


def tokenize(text: str) -> list[str]:
    out: list[str] = []
    for token in _TOKEN.findall(text.lower()):
        if _CJK.search(token):
            out.extend(token[i : i + 2] for i in range(max(1, len(token) - 1)))
        elif token not in STOPWORDS:
            out.append(normalize_word(token))
    return out
