"""Text for a terminal: its control characters shown as visible symbols, never obeyed.

What a chat holds was written by others: the people in it, the pages and files its tools read, the model,
a stranger's profile name. Printed as it is, a terminal acts on the control characters in it: ESC starts
sequences that retitle the window, clear the screen, write the clipboard (OSC 52) or hide text, ``\\r``
and ``\\b`` write over what was shown, and the bidi controls (U+202E and its kin) show what follows in
another order (U+202E then ``txt.exe`` reads "exe.txt"). Each is printed as a visible symbol instead (ESC as
␛, C1 and bidi controls as �); ``\\n`` and ``\\t`` stay, and ``\\r`` is dropped so that ``\\r\\n``
stays a line end. The other format characters stay: the zero-width joiner (U+200D) holds emoji such as
"woman technologist" together. Per character, so the pieces of a streamed answer map like the whole.

    console.print(printable(message.content))   # membot sessions show
"""

from __future__ import annotations

_SHOWN = {
    **{code: chr(0x2400 + code) for code in range(0x20) if chr(code) not in "\n\t"},
    0x0D: None,
    0x7F: "\u2421",
    **dict.fromkeys(range(0x80, 0xA0), "\ufffd"),
    # Bidi controls: embeddings and overrides, isolates, the marks (LRM, RLM, ALM).
    **dict.fromkeys([*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C], "\ufffd"),
}


def printable(text: str) -> str:
    """``text`` with every control character but ``\\n`` and ``\\t``, and every bidi control, made visible
    (see the module doc)."""
    return text.translate(_SHOWN)


# What JSON leaves raw with ``ensure_ascii=False`` (it escapes only the C0 controls) but a terminal obeys.
_RAW_IN_JSON = {code: f"\\u{code:04x}" for code, shown in _SHOWN.items() if code >= 0x7F and shown}


def json_escaped(text: str) -> str:
    """JSON text (``json.dumps(..., ensure_ascii=False)``) with DEL, the C1 and the bidi controls written
    as ``\\u`` escapes: the same JSON to any parser, word for word, and nothing a terminal obeys. They
    can occur only inside its strings, where an escape means the same character."""
    return text.translate(_RAW_IN_JSON)
