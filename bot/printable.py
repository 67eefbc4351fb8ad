"""Text for a terminal: its control characters shown as visible symbols, never obeyed.

What a chat holds was written by others: the people in it, the pages and files its tools read, the model.
Printed as it is, a terminal acts on the control characters in it: ESC starts sequences that retitle the
window, clear the screen, write the clipboard (OSC 52) or hide text, and ``\\r`` and ``\\b`` write over
what was shown. Each is printed as its visible symbol instead (ESC as ␛, C1 controls as �); ``\\n`` and
``\\t`` stay, and ``\\r`` is dropped so that ``\\r\\n`` stays a line end. Per character, so the pieces of
a streamed answer map like the whole.

    console.print(printable(message.content))   # membot sessions show
"""

from __future__ import annotations

_SHOWN = {
    **{code: chr(0x2400 + code) for code in range(0x20) if chr(code) not in "\n\t"},
    0x0D: None,
    0x7F: "\u2421",
    **dict.fromkeys(range(0x80, 0xA0), "\ufffd"),
}


def printable(text: str) -> str:
    """``text`` with every control character but ``\\n`` and ``\\t`` made visible (see the module doc)."""
    return text.translate(_SHOWN)
