"""What cao types into a pane: neutralised text, and inbox messages under unforgeable headers.

A pasted message reads::

    [cao message #42 from 1a2b3c4d] (ref 5f0c2a9e41b7)
    the body, neutralised
    [end of cao message #42] (ref 5f0c2a9e41b7)      ← only for long bodies

The ``ref`` is a per-message nonce stored with the row; it is what delivery looks for when it must
find out whether a paste arrived (after a crash, an unconfirmed submit, a lost lease). Bodies can't
contain ``[cao message`` or ``[end of cao message`` (they become ``[quoted cao message``…), so no
body can pose as another message, another sender, or as evidence that another message arrived.
The trailer keeps a long body recognisable after its header scrolled out of the pane's history.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Protocol

_C0_KEEP = {"\n", "\t"}
FILLERS = frozenset("\u115f\u1160\u3164\uffa0\u2800")  # letters that draw nothing
_HEADER_LIKE = re.compile(r"\[(?=(?:end of )?cao message)", re.I)
# A body this long may push its own header out of a pane's history before anyone looks for it.
TRAILER_MIN_CHARS = 1000
TRAILER_MIN_LINES = 10


class Addressed(Protocol):
    id: int | None
    sender_id: str
    body: str
    nonce: str | None


def neutralise(text: str) -> str:
    """Make text safe to paste: no escape sequence, paste marker or control key survives, and no
    line can pose as a cao message header.

    ESC becomes the visible ``␛`` (so ``ESC[201~`` can't end the bracketed paste), other C0
    controls their Unicode control pictures, CR/CRLF a newline, C1 controls ``<U+XXXX>``;
    ``[cao message`` becomes ``[quoted cao message``. Printable text (any language) is untouched.
    """
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    out: list[str] = []
    for ch in text:
        code = ord(ch)
        if code < 0x20 and ch not in _C0_KEEP:
            out.append(chr(0x2400 + code))
        elif code == 0x7F:
            out.append("␡")
        elif 0x80 <= code < 0xA0:
            out.append(f"<U+{code:04X}>")
        else:
            out.append(ch)
    return _HEADER_LIKE.sub("[quoted ", "".join(out))


def is_blank(text: str) -> bool:
    """True if nothing visible is left once whitespace, control and format characters (zero-width
    spaces, joiners, BOMs: Unicode Cc/Cf) and letters that draw nothing are gone."""
    return all(ch.isspace() or ch in FILLERS or unicodedata.category(ch) in ("Cc", "Cf") for ch in text)


def header(message: Addressed) -> str:
    return f"[cao message #{message.id} from {message.sender_id}] (ref {message.nonce})"


def trailer(message: Addressed) -> str:
    return f"[end of cao message #{message.id}] (ref {message.nonce})"


def needs_trailer(body: str) -> bool:
    return len(body) >= TRAILER_MIN_CHARS or body.count("\n") >= TRAILER_MIN_LINES


INLINE_LIMIT = 4096  # bytes; settings.inline_limit (CAO_INBOX_INLINE_LIMIT)
PREVIEW_CHARS = 300


def announcement(message: Addressed) -> str:
    """What is typed for a body above the inline limit: a preview and how to read the rest."""
    body = message.body
    size = len(body.encode("utf-8", "surrogatepass"))
    preview = " ".join(neutralise(body[:PREVIEW_CHARS]).split())
    return (
        f"(a long message: {size} bytes, {body.count(chr(10)) + 1} lines; it begins: {preview} …)\n"
        f"Read it whole with the read_message tool (message_id {message.id}) "
        f"or `cao inbox read {message.id}`."
    )


def format_message(message: Addressed, inline_limit: int = INLINE_LIMIT) -> str:
    typed = neutralise(message.body)  # what would be typed: control characters grow into pictures
    if len(typed.encode("utf-8", "surrogatepass")) > inline_limit:
        return f"{header(message)}\n{announcement(message)}\n{trailer(message)}"
    text = f"{header(message)}\n{typed}"
    return f"{text}\n{trailer(message)}" if needs_trailer(message.body) else text


def format_batch(messages: list[Addressed], inline_limit: int = INLINE_LIMIT) -> str:
    """One paste carrying several messages, in order, each attributed to its sender (a body
    above ``inline_limit`` bytes as its announcement)."""
    return "\n\n".join(format_message(m, inline_limit) for m in messages)


def arrived(message: Addressed, transcript: str) -> bool:
    """Did ``message`` arrive? Its own header or trailer (with its nonce) shows in ``transcript``
    (the pane's history above the input box, wrapped lines joined)."""
    return header(message) in transcript or trailer(message) in transcript


# How CLIs collapse a long input in their box: "[+3 lines]", "[Pasted text #1 +41 lines]", "…"
_COLLAPSED = re.compile(r"\[\+\d+ lines\]|\[Pasted [Tt]ext[^\]]*\]|…")


def is_ours(box: str, message: Addressed, pasted: str | None = None) -> bool:
    """Does the input box hold text cao can prove is its own paste (``pasted``, which starts with
    ``message``'s header), and nothing else? Every visible piece of the box, between the markers
    CLIs use for collapsed input, must be part of what cao pasted, in order; text a person typed
    before or after it makes the box not ours (cao then never presses Enter on it)."""
    pieces = [" ".join(p.split()) for p in _COLLAPSED.split(box)]
    pieces = [p for p in pieces if p]
    if not pieces or not pieces[0].startswith(header(message)):
        return False
    if pasted is None:
        return len(pieces) == 1 and pieces[0] == header(message)
    flat = " ".join(pasted.split())
    at = 0
    for piece in pieces:
        found = flat.find(piece, at)
        if found < 0:
            return False
        at = found + len(piece)
    return True
