"""A chat template's render with a fixed budget of work and of size, whatever the template does.

Jinja's sandbox stops a template from reaching Python's internals, not from working without end: a loop
over ``'x' * 100000`` inside another, ``2 ** 1000000000``, ``'%999999999d' % 1``, ``indent(1000000)`` over
many lines, ``tojson(indent=1000000000)``, a string doubled in a loop or a message repeated ``1e8`` times
each run for minutes or take gigabytes on one record. ``bounded_template(text, like)`` compiles the
template in a sandbox that meters it (``BoundedSandbox``: the environment transformers compiles chat
templates in, its filters, globals and extensions, with these hooks), and ``render_chat`` renders one
conversation within its budget:

* **steps**: ``STEP_BUDGET`` in all. Each loop item, call, filter, test, attribute or item lookup and
  intercepted operator takes one, and one more for every item of a list, dict or tuple and every
  ``CHARS_PER_STEP`` characters of a string it reads or makes (a comparison of two strings weighs them);
* **size**: no value made larger than ``MAX_TEXT`` characters or items, no integer over ``MAX_INT_BITS``
  bits, and no more than ``MAX_TEXT`` characters written in all. A value is measured before it is made
  where it could grow past its inputs (``*``, ``**``, ``%`` and ``format`` widths, ``indent``,
  ``center``, ``ljust``, ``replace``, ``join``, ``tojson``'s indent, ``lipsum``, ``to_bytes``: the sizes
  of ``template_sizes``), so no such value is ever allocated; any other value is at most a few times its
  inputs and is measured once made.

Going over either is ``TemplateBudgetError`` (a ``ValueError``), raised in the render: the chat encoder
makes it that record's bad input (``template_budget``), named and skipped under ``--on-error skip``. A
render within the budget gives the text an unmetered one gives (``apply_chat_template``'s): the hooks
only measure.

How: the template's syntax tree is rewritten before it is compiled (``_Meter``): each ``for`` loop's
iterable, each output, each ``~`` concatenation and each comparison's operands pass through a filter of
packtool's (named ``packtool.*``, a name no template can write), marked ``pass_context`` so that Jinja
never evaluates one while it compiles; ``*``, ``**``, ``%`` and ``+`` are intercepted operators
(``call_binop``); calls, attribute and item lookups go through the sandbox's own hooks; every filter and
test is wrapped.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sized
from contextvars import ContextVar
from typing import Any

from jinja2 import nodes, pass_context
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import _PassArg
from jinja2.visitor import NodeTransformer
from transformers.utils import chat_template_utils

from packtool.tokenizing.template_sizes import (
    CONTAINERS,
    FILTER_SIZES,
    GLOBAL_SIZES,
    MAX_INT_BITS,
    MAX_TEXT,
    METHOD_SIZES,
    TEXT,
    binop_size,
    int_bits,
    integers,
)

STEP_BUDGET = 250_000  # steps one render may take (about 0.5 s of the slowest, a filter's each)
CHARS_PER_STEP = 64  # characters a step reads or makes


class TemplateBudgetError(ValueError):
    """A chat template's render went over its budget of steps or of size (the module docstring); its
    record is skipped under ``--on-error skip`` as ``skip_reason``."""

    skip_reason = "template_budget"


class _Budget:
    """What one render has left: steps, and characters to write."""

    def __init__(self) -> None:
        self.steps, self.output = STEP_BUDGET, MAX_TEXT

    def take(self, steps: int) -> None:
        self.steps -= steps
        if self.steps < 0:
            self.over()

    def over(self) -> None:
        if self.output < 0:
            raise TemplateBudgetError(
                f"the chat template writes more than {MAX_TEXT:,} characters for one conversation"
            )
        raise TemplateBudgetError(
            f"the chat template takes more than {STEP_BUDGET:,} steps in one conversation (loops, calls "
            "and the text they read): packtool stops it"
        )


_BUDGET: ContextVar[_Budget | None] = ContextVar("packtool_template_budget", default=None)


def _take(steps: int) -> None:
    budget = _BUDGET.get()
    if budget is not None:
        budget.take(steps)


def _weight(value: Any) -> int:
    """The steps reading ``value`` takes beyond one: an item of a container, ``CHARS_PER_STEP`` characters.

    >>> _weight("x" * 640), _weight([1, 2, 3]), _weight(7)
    (10, 3, 0)
    """
    if isinstance(value, TEXT):
        return len(value) // CHARS_PER_STEP
    if isinstance(value, CONTAINERS) or type(value) is range:
        return len(value)
    return 0


def _too_large(size: int, how: str = "") -> None:
    """``TemplateBudgetError`` for a value of ``size`` characters or items (made ``how``) past the limit."""
    if size > MAX_TEXT:
        raise TemplateBudgetError(
            f"the chat template would make a value of {size:,} characters or items{how} (at most "
            f"{MAX_TEXT:,})"
        )


def _too_many_bits(bits: int) -> None:
    if bits > MAX_INT_BITS:
        raise TemplateBudgetError(
            f"the chat template would make an integer of {bits:,} bits or more (at most {MAX_INT_BITS:,})"
        )


def _made(value: Any) -> Any:
    """``value`` once made: within the size limits, its weight taken from the budget."""
    if isinstance(value, TEXT):
        _too_large(len(value))
        _take(1 + len(value) // CHARS_PER_STEP)
    elif isinstance(value, CONTAINERS):
        _too_large(len(value))
        _take(1 + len(value))
    else:
        if isinstance(value, int) and not isinstance(value, bool):
            _too_many_bits(value.bit_length())
        _take(1)
    return value


def _check_call(func: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Refuse a call whose result would be over the size limits; the arguments, an iterator among them
    turned into a list (``join``'s, so that it is measured and still joined)."""
    func = getattr(func, "__wrapped__", func)  # the sandbox's str.format wrapper
    bound, name = getattr(func, "__self__", None), getattr(func, "__name__", "")
    if isinstance(bound, str | bytes | int) and name in METHOD_SIZES:  # (str | bytes: a format's bytes too)
        if name == "join" and args and not isinstance(args[0], Sized):
            args = (list(args[0]), *args[1:])
        predict, what = functools.partial(METHOD_SIZES[name], bound), f" with {name}()"
    elif name in GLOBAL_SIZES and bound is None:
        predict, what = GLOBAL_SIZES[name], f" with {name}()"
    else:  # (the methods of the types a template can reach that make more than they read are above)
        return args, kwargs
    try:
        size = predict(*args, **kwargs)
    except (TypeError, ValueError, AttributeError):  # the call itself says what is wrong
        size = 0
    _too_large(size, what)
    return args, kwargs


def _metered_filter(name: str, func: Any) -> Any:
    """``func`` (a filter or test) measured: its arguments' weight taken, its value's size predicted where
    ``FILTER_SIZES`` knows it, its result measured once made. ``pass_context``, so never run while the
    template compiles."""
    pass_arg = _PassArg.from_obj(func)
    predict = FILTER_SIZES.get(name)

    @pass_context
    @functools.wraps(func)
    def metered_filter(context, value, *args, **kwargs):
        if name == "join" and not isinstance(value, Sized):
            value = list(value)
        steps = 1 + _weight(value)
        for arg in args:
            steps += _weight(arg)
        if kwargs:
            steps += sum(map(_weight, kwargs.values()))
        _take(steps)
        if predict is not None:
            try:
                size = predict(value, *args, **kwargs)
            except (TypeError, ValueError, AttributeError):  # the filter itself says what is wrong
                size = 0
            _too_large(size, f" with |{name}")
        return _made(_passed(func, pass_arg, context, value, args, kwargs))

    return metered_filter


def _metered_test(func: Any) -> Any:
    """``func`` (a test: its answer a bool) measured: its value's and arguments' weight taken."""
    pass_arg = _PassArg.from_obj(func)

    @pass_context
    @functools.wraps(func)
    def metered_test(context, value, *args, **kwargs):
        budget = _BUDGET.get()
        if budget is not None:  # (inline: a template tests every message, often several times)
            budget.take(1 + _weight(value) + (sum(map(_weight, args)) if args else 0))
        if pass_arg is None:
            return func(value, *args, **kwargs)
        return _passed(func, pass_arg, context, value, args, kwargs)

    return metered_test


def _passed(func: Any, pass_arg: Any, context: Any, value: Any, args: tuple, kwargs: dict) -> Any:
    """``func(value, *args, **kwargs)`` given first what its Jinja ``pass_*`` marker asks for (the context,
    its eval context or the environment), as Jinja calls a filter or test."""
    if pass_arg is _PassArg.context:
        return func(context, value, *args, **kwargs)
    if pass_arg is _PassArg.eval_context:
        return func(context.eval_ctx, value, *args, **kwargs)
    if pass_arg is _PassArg.environment:
        return func(context.environment, value, *args, **kwargs)
    return func(value, *args, **kwargs)


# --- the template's own steps: loops, output, concatenation, comparison ---------------------------------


class _CountedItems:
    """An iterable whose items, as they are taken, each take a step; ``len`` as the iterable's (Jinja's
    ``loop.length`` asks for it)."""

    def __init__(self, items: Any) -> None:
        self._items = items

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Any]:
        budget = _BUDGET.get()
        for item in self._items:
            if budget is not None:
                budget.take(1)
            yield item


@pass_context
def _loop_items(context, items):
    return _CountedItems(items) if items is not None and hasattr(items, "__iter__") else items


@pass_context
def _output(context, value):
    text = str(value)
    budget = _BUDGET.get()
    if budget is not None:  # (the budget's arithmetic inline: every output of every render passes here)
        budget.output -= len(text)
        budget.steps -= 1 + len(text) // CHARS_PER_STEP
        if budget.steps < 0 or budget.output < 0:
            budget.over()
    return text


@pass_context
def _concat(context, parts):
    texts = [str(p) for p in parts]
    _too_large(sum(map(len, texts)), " with ~")
    return _made("".join(texts))


@pass_context
def _weigh(context, value):
    _take(1 + _weight(value))
    return value


OWN_FILTERS = {"packtool.loop": _loop_items, "packtool.output": _output, "packtool.concat": _concat,
               "packtool.weigh": _weigh}  # fmt: skip


def _through(node: nodes.Expr, name: str) -> nodes.Filter:
    return nodes.Filter(node, name, [], [], None, None, lineno=node.lineno)


class _Meter(NodeTransformer):
    """Routes a template's loops, outputs, ``~`` and comparisons through ``OWN_FILTERS``."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        node = self.generic_visit(node)
        node.iter = _through(node.iter, "packtool.loop")
        return node

    def visit_Output(self, node: nodes.Output) -> nodes.Node:
        node = self.generic_visit(node)
        node.nodes = [n if isinstance(n, nodes.TemplateData) else _through(n, "packtool.output")
                      for n in node.nodes]  # fmt: skip
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        node = self.generic_visit(node)
        return _through(nodes.List(node.nodes, lineno=node.lineno), "packtool.concat")

    def visit_Compare(self, node: nodes.Compare) -> nodes.Node:
        node = self.generic_visit(node)
        node.expr = _weighed(node.expr)
        for operand in node.ops:
            operand.expr = _weighed(operand.expr)
        return node


def _weighed(node: nodes.Expr) -> nodes.Expr:
    """``node`` through ``packtool.weigh``, unless a constant (the template's own text: no larger than it)."""
    return node if isinstance(node, nodes.Const) else _through(node, "packtool.weigh")


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox with the budget's hooks (module docstring)."""

    intercepted_binops = frozenset({"*", "**", "%", "+"})

    def _parse(self, source, name, filename):
        return _Meter().visit(super()._parse(source, name, filename))

    def call_binop(self, context, operator, left, right):
        if operator == "+" and type(left) is str and type(right) is str:  # (the common case, inline)
            size = len(left) + len(right)
            _too_large(size, " with +")
            budget = _BUDGET.get()
            if budget is not None:  # read both, make one of their size
                budget.take(2 + (len(left) + len(right) + size) // CHARS_PER_STEP)
            return left + right
        _take(1 + _weight(left) + _weight(right))
        if integers(left, right) and operator in ("*", "**"):
            _too_many_bits(int_bits(operator, left, right))
        else:
            _too_large(binop_size(operator, left, right), f" with {operator}")
        return _made(super().call_binop(context, operator, left, right))

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - the sandbox's own signature
        _take(1 + sum(map(_weight, args)) + sum(map(_weight, kwargs.values())))
        if isinstance(__obj, LoopContext) and args:  # a recursive loop's next level: its items counted
            args = (_CountedItems(args[0]), *args[1:])
        args, kwargs = _check_call(__obj, args, kwargs)
        return _made(super().call(__context, __obj, *args, **kwargs))

    def getattr(self, obj, attribute):
        budget = _BUDGET.get()
        if budget is not None:
            budget.take(1)
        return super().getattr(obj, attribute)

    def getitem(self, obj, argument):
        value = super().getitem(obj, argument)
        budget = _BUDGET.get()
        if budget is not None:
            budget.take(1 + _weight(value) if type(argument) is slice else 1)
        return value


def bounded_template(text: str, like: Any) -> Any:
    """``text`` compiled in a ``BoundedSandbox`` with the options, extensions, filters, tests and globals
    of ``like``'s environment (a template transformers compiled: never ``text`` itself, whose constant
    expressions Jinja would evaluate unbounded as it compiles), its filters and tests metered. Render it
    with ``render_chat``."""
    env = like.environment
    bounded = BoundedSandbox(
        trim_blocks=env.trim_blocks,
        lstrip_blocks=env.lstrip_blocks,
        keep_trailing_newline=env.keep_trailing_newline,
        extensions=[type(e) for e in env.extensions.values()],
    )
    bounded.globals.update(env.globals)
    bounded.filters.update({k: _metered_filter(k, f) for k, f in env.filters.items()})
    bounded.tests.update({k: _metered_test(f) for k, f in env.tests.items()})
    bounded.filters.update(OWN_FILTERS)
    return bounded.from_string(text)


def render_chat(
    template: Any,
    messages: list[dict],
    tools: list | None,
    add_generation_prompt: bool,
    with_spans: bool,
    variables: dict[str, Any],
) -> tuple[str, list[tuple[int, int]]]:
    """One conversation rendered by ``template`` (``bounded_template``'s) within one budget, as
    transformers' ``render_jinja_template`` renders it: the data the template sees made plain JSON values
    and a message's reasoning under the names templates read (transformers' own helpers, where its
    version has them), and with ``with_spans`` the ``{% generation %}`` spans (its ``AssistantTracker``).
    """
    plain = getattr(chat_template_utils, "_plain_template_data", lambda value: value)
    aliased = getattr(chat_template_utils, "_alias_reasoning_fields", lambda chat: chat)
    if tools is not None and not all(isinstance(tool, dict) for tool in tools):
        raise ValueError("tools must be JSON schemas (objects)")
    values = dict(
        messages=aliased(plain(messages)),
        tools=plain(tools),
        documents=None,
        add_generation_prompt=add_generation_prompt,
        **plain(variables),
    )
    budget = _BUDGET.set(_Budget())
    try:
        if not with_spans:
            return template.render(**values), []
        blocks: list[str] = []
        spans: list[tuple[int, int]] = []
        with template.environment.activate_tracker(blocks, spans):
            for block in template.generate(**values):
                blocks.append(block)
        return "".join(blocks), [tuple(s) for s in spans]
    finally:
        _BUDGET.reset(budget)
