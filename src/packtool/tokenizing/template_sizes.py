"""How large a value a chat template's operation would make, known before it is made: the sizes
``template_sandbox`` checks against its limits (``MAX_TEXT`` characters or items, ``MAX_INT_BITS`` bits)
so that no over-large value is ever allocated.

Each answer is at least what the operation makes (an over-estimate where it cannot be exact): a
repetition's length, a format's widths (``%999999999d``, ``{:>999999999}``, widths taken from the
arguments), ``indent`` over every line, ``tojson``'s indent at every depth, ``replace``'s and ``join``'s
products, ``lipsum``'s paragraphs, ``to_bytes``'s length, a power's bits.

>>> binop_size("*", "ab", 3), int_bits("**", 2, 10)
(6, 11)
"""

from __future__ import annotations

import re
from string import Formatter
from typing import Any

MAX_TEXT = 64 << 20  # characters (or items) one value may hold, and one render may write
MAX_INT_BITS = 1 << 16  # the largest integer a template may make (Python prints at most 4,300 digits)
TEXT = (str, bytes)
CONTAINERS = (list, tuple, dict, set, frozenset)


def count(value: Any) -> int:
    """A width or count as an argument gives it (an int; a string's length, as ``indent`` takes one)."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(value, 0)
    return len(value) if isinstance(value, str) else 0


_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?")
_NUMBER = re.compile(r"\d+")


def _number(digits: str) -> int:
    return int(digits) if len(digits) < 10 else MAX_TEXT + 1


def percent_widths(form: str) -> tuple[int, bool]:
    """The widths and precisions ``form``'s ``%`` conversions name, and whether one takes its own from the
    arguments (``%*d``).

    >>> percent_widths("%-8s|%.3f|%d%%")
    (11, False)
    """
    total, star = 0, False
    for spec in _PERCENT_SPEC.finditer(form):
        for part in spec.groups():
            star |= part == "*"
            total += _number(part) if part and part != "*" else 0
    return total, star


def format_widths(form: str) -> tuple[int, bool]:
    """The numbers in ``form``'s ``str.format`` specs (widths, precisions), and whether a spec takes one
    from the arguments (``{:{w}}``).

    >>> format_widths("{0:>10}|{x:.2f}|{y:{w}}")
    (12, True)
    """
    total, nested = 0, False
    try:
        fields = list(Formatter().parse(form))
    except ValueError:  # the call itself says what is wrong
        return 0, False
    for _, _, spec, _ in fields:
        if spec:
            nested |= "{" in spec
            total += sum(_number(n) for n in _NUMBER.findall(spec))
    return total, nested


def format_size(form: str, args: tuple, kwargs: dict, percent: bool) -> int:
    """At most the characters ``form % args`` (``percent``) or ``form.format(*args, **kwargs)`` makes: the
    form, the widths it names, the arguments' lengths (an int's digits), and ints among them as widths
    where the form takes widths from its arguments (``%*d``, ``{:{w}}``)."""
    widths, from_args = percent_widths(form) if percent else format_widths(form)
    size = len(form) + widths
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and not isinstance(value, bool):
            size += value.bit_length() // 3 + 2 + (max(value, 0) if from_args else 0)
        else:
            size += 6 * deep_size(value) + 2
    return size


def deep_size(value: Any, limit: int = MAX_TEXT) -> int:
    """Characters and items in ``value``, walked until they pass ``limit``."""
    if isinstance(value, TEXT):
        return len(value)
    if isinstance(value, dict):
        value = [*value.keys(), *value.values()]
    if not isinstance(value, list | tuple):  # (a number, None)
        return 8
    total = len(value)
    for item in value:
        total += deep_size(item, limit - total)
        if total > limit:
            break
    return total


def _depth(value: Any, limit: int = 1000) -> int:
    if isinstance(value, dict):
        value = list(value.values())
    if not isinstance(value, list | tuple) or not value or limit <= 0:
        return 0
    return 1 + max(_depth(v, limit - 1) for v in value)


def json_size(value: Any, indent: Any = None, separators: Any = None, **_: Any) -> int:
    """At most the characters ``json.dumps(value, indent=indent)`` makes: six per character (``\\uXXXX``),
    and every item on a line of its own at its depth's indent."""
    size = 6 * deep_size(value) + 2
    if separators is not None:
        size += deep_size(value) * sum(len(s) for s in separators if isinstance(s, str))
    if indent is not None:
        size += deep_size(value) * (1 + count(indent) * _depth(value))
    return size


def replace_size(text: Any, old: Any, new: Any, count: Any = -1) -> int:
    if not (isinstance(text, bytes) and isinstance(old, bytes) and isinstance(new, bytes)):
        text, old, new = str(text), str(old), str(new)
    times = text.count(old) if old else len(text) + 1
    if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
        times = min(times, count)
    return len(text) + times * max(0, len(new) - len(old))


def join_size(items: list, separator: Any = "") -> int:
    return sum(len(str(x)) if isinstance(x, str) else deep_size(x) for x in items) + len(items) * len(
        str(separator)
    )


def _lines(value: Any) -> int:
    return str(value).count("\n") + 1


# what a filter makes, at most, from its value and arguments (filters whose output is a few times their
# input at most, or smaller, are measured once made)
FILTER_SIZES = {
    "indent": lambda s, width=4, *_, **__: len(str(s)) + _lines(s) * count(width),
    "center": lambda s, width=80: max(len(str(s)), count(width)),
    "wordwrap": lambda s, width=79, break_long_words=True, wrapstring=None, *_: (
        len(str(s)) * (1 + len(str(wrapstring or "\n")))
    ),
    "replace": replace_size,
    "format": lambda form, *args, **kwargs: format_size(str(form), args, kwargs, True),
    "tojson": json_size,
    "pprint": lambda value: deep_size(value) * (1 + _depth(value)) * 2 + 2,
    "batch": lambda value, count, *_: deep_size(value) + count(count),
    "slice": lambda value, count, *_: deep_size(value) + count(count),
    "join": lambda items, d="", attribute=None: join_size(items, d),
}

# what a call makes, at most, by the called method's name and the object it is bound to
METHOD_SIZES = {
    "ljust": lambda s, width, *_: max(len(s), count(width)),
    "rjust": lambda s, width, *_: max(len(s), count(width)),
    "center": lambda s, width, *_: max(len(s), count(width)),
    "zfill": lambda s, width: max(len(s), count(width)),
    "expandtabs": lambda s, tabsize=8: (
        len(s) + s.count("\t" if isinstance(s, str) else b"\t") * count(tabsize)
    ),
    "replace": replace_size,
    "join": lambda sep, items: join_size(items, sep),
    "format": lambda form, *args, **kwargs: format_size(form, args, kwargs, False),
    "format_map": lambda form, mapping: format_size(form, (), dict(mapping), False),
    "translate": lambda s, table: len(s) * max([1, *(len(str(v)) for v in dict(table).values())]),
    "to_bytes": lambda n, length=1, *_, **__: count(length),
}
GLOBAL_SIZES = {  # lipsum(n, html, min, max): n paragraphs of at most ``max`` words
    "generate_lorem_ipsum": lambda n=5, html=True, min=20, max=100: count(n) * (count(max) + 1) * 16
}


def integers(*values: Any) -> bool:
    for v in values:
        if not isinstance(v, int) or isinstance(v, bool):
            return False
    return True


def int_bits(operator: str, left: int, right: int) -> int:
    """At least the bits of ``left * right`` or ``left ** right``, less one (``*``)."""
    if operator == "*":
        return left.bit_length() + right.bit_length() - 1
    if right <= 0 or abs(left) <= 1:
        return 1
    return (abs(left).bit_length() - 1) * right + 1


def binop_size(operator: str, left: Any, right: Any) -> int:
    """At most the characters or items ``left operator right`` makes, a string, list or tuple."""
    sized = (str, bytes, list, tuple)
    if operator == "*":
        if isinstance(left, sized) and integers(right):
            return len(left) * max(right, 0)
        if isinstance(right, sized) and integers(left):
            return len(right) * max(left, 0)
    if operator == "%" and isinstance(left, TEXT):
        args = right if isinstance(right, tuple) else (right,)
        form = left if isinstance(left, str) else left.decode("latin-1")
        return format_size(form, args, {}, True)
    if operator == "+" and isinstance(left, sized) and isinstance(right, sized):
        return len(left) + len(right)
    return 0
