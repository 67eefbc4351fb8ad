"""One line of ``membot doctor`` (and of ``membot run``'s look at the model endpoint after start): a
check's name, its outcome, what it found and how to fix it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Status = Literal["pass", "warn", "fail", "skip"]


@dataclass(frozen=True, slots=True)
class Check:
    """The outcome of one check; ``hint`` (how to fix it) is printed when it is a warn or a fail."""

    name: str
    status: Status
    detail: str
    hint: str = ""
