"""Text that is not UTF-8 (``--decode``): the policy, checked once, and applied to one text.

Input text is UTF-8. A text (a line of a ``.txt`` or JSON Lines file, a file of a text directory, a text
member of a tar) that is not is, under each policy:

* ``strict`` (the default): a bad record (``not_utf8``), named by its file and line: the run stops, or
  ``--on-error skip`` leaves it out and counts it;
* ``replace``: packed with each sequence of bytes that is not UTF-8 replaced by U+FFFD; the records and
  the characters replaced are counted;
* an encoding (``latin-1``, ``cp1252``, ``shift_jis``: any Python codec that reads ASCII as ASCII, so that
  lines are found in it): decoded from that encoding, and counted. A text that is UTF-8 stays UTF-8, so a
  tree of UTF-8 files with a few legacy ones reads every file right (decoding every file as Latin-1 would
  turn each UTF-8 accent into two characters, with nothing to tell). A text the encoding cannot read
  either is a bad record, as under ``strict``.

Counted: ``DECODED`` records (``ErrorSink.note``), ``REPLACED`` characters.

>>> decode_text(b"caf\\xe9", "latin-1"), decode_text(b"caf\\xe9 \\xff", "replace")
(('café', 0), ('caf\\ufffd \\ufffd', 2))
"""

from __future__ import annotations

import codecs

from packtool.errors import ConfigError, ErrorSink, InputError

DECODE_POLICIES = ("strict", "replace")
DECODED, REPLACED = "decoded_records", "replaced_characters"  # ErrorSink.notes keys (and Stats fields)
_ASCII = bytes(range(128))


def check_decode(policy: str) -> None:
    """``ConfigError`` unless ``policy`` is ``strict``, ``replace`` or an encoding that reads ASCII as
    ASCII (UTF-16 does not: its newlines are two bytes, so lines cannot be found in it)."""
    if policy in DECODE_POLICIES:
        return
    try:
        codecs.lookup(policy)
        same = _ASCII.decode(policy) == _ASCII.decode("ascii")
    except LookupError:
        raise ConfigError(
            f"--decode {policy}: not strict, replace, or an encoding Python knows (e.g. latin-1, cp1252, "
            "shift_jis)"
        ) from None
    except (UnicodeError, TypeError):
        same = False
    if not same:
        raise ConfigError(
            f"--decode {policy}: an encoding that does not read ASCII bytes as ASCII (newlines included), so "
            "lines cannot be found in it: convert the files to UTF-8 first (iconv -f ... -t utf-8)"
        )


def decode_text(raw: bytes, policy: str) -> tuple[str, int]:
    """``raw``, which is not UTF-8, read under ``policy``: its text and how many characters were replaced
    by U+FFFD. ``UnicodeError`` where the policy reads no text (``strict``, or bytes the encoding has no
    character for)."""
    if policy == "replace":
        text = raw.decode("utf-8", "replace")
        return text, text.count("\ufffd") - raw.count("\ufffd".encode())
    if policy == "strict" or codecs.lookup(policy).name == "utf-8":
        return raw.decode("utf-8"), 0
    text = raw.decode(policy)
    text.encode("utf-8")  # a codec that makes lone surrogates: no text either
    return text, 0


def read_text(raw: bytes, policy: str, sink: ErrorSink, where: dict) -> str | None:
    """``raw`` as text: UTF-8, else read by ``policy`` and counted in ``sink`` (``DECODED``,
    ``REPLACED``); a text it cannot read goes to ``sink`` as a bad record (None), ``where`` naming it
    (``InputError``'s keywords: ``source``, ``row``, ``row_kind``)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        first = e
    try:
        text, replaced = decode_text(raw, policy)
    except UnicodeError as e:
        sink.bad(not_utf8(first, policy, e, **where))
        return None
    sink.note(DECODED)
    if replaced:
        sink.note(REPLACED, replaced)
    return text


def not_utf8(e: UnicodeDecodeError, policy: str, again: UnicodeError | None = None, **where) -> InputError:
    """The bad record's error: not UTF-8 (at byte ``e.start``), nor the encoding ``policy`` names."""
    message = f"not valid UTF-8 (byte {e.start})"
    if policy not in DECODE_POLICIES and isinstance(again, UnicodeDecodeError):
        message += f" nor {policy} (byte {again.start})"
    err = InputError(message, code="not_utf8", **where)
    if policy == "strict":
        err.hint = (
            "--on-error skip leaves bad records out and counts them; --decode replace or --decode ENCODING "
            "(e.g. latin-1) reads them"
        )
    return err


def decoded_warnings(notes: dict[str, int], policy: str) -> list[str]:
    """The line a run ends with when it read records by ``policy`` (``notes``: ``ErrorSink.notes``).

    >>> decoded_warnings({"decoded_records": 2, "replaced_characters": 5}, "replace")
    ['2 records were not UTF-8 and were packed with 5 characters replaced by U+FFFD (--decode replace)']
    """
    records = notes.get(DECODED, 0)
    if not records:
        return []
    what = f"{records:,} record{'s' if records != 1 else ''} {'were' if records != 1 else 'was'} not UTF-8"
    if policy == "replace":
        replaced = notes.get(REPLACED, 0)
        chars = f"{replaced:,} character{'s' if replaced != 1 else ''}"
        return [f"{what} and {'were' if records != 1 else 'was'} packed with {chars} replaced by U+FFFD "
                "(--decode replace)"]  # fmt: skip
    return [f"{what} and {'were' if records != 1 else 'was'} read as {policy} (--decode {policy})"]
