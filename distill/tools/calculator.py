"""Exact arithmetic over a whitelisted AST, because planner inputs are untrusted text: `eval` would run
anything a model writes. Every power and every intermediate result is bounded *before* it is computed, so
an input like `9**9**9` is refused at once instead of hanging the Worker."""

from __future__ import annotations

import ast
import math
import operator
import re
from typing import Callable

Number = int | float

MAX_INPUT_CHARS = 500
MAX_EXPONENT = 1000
MAX_DIGITS = 1000  # integer results stay below 10**MAX_DIGITS, far under Python's str() limit

_BINARY: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Number], Number]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def evaluate(expression: str) -> Number:
    """Evaluate `expression` or raise ValueError saying what is not allowed."""
    text = expression.strip()
    if len(text) > MAX_INPUT_CHARS:
        raise ValueError(f"expression longer than {MAX_INPUT_CHARS} characters")
    text = text.rstrip("=").strip()
    if not text:
        raise ValueError("empty expression")
    try:
        tree = ast.parse(_THOUSANDS.sub("", text), mode="eval")
    except (SyntaxError, ValueError) as exc:  # ValueError: over-long integer literals, null bytes
        raise ValueError(f"not an arithmetic expression: {expression.strip()!r}") from exc
    return _eval(tree.body)


def format_number(value: Number) -> str:
    """Integers without `.0`; floats to 12 significant digits so 0.1+0.2 reads as 0.3."""
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else format(value, ".12g")
    return str(value)


class Calculator:
    """The `Calculator` tool: evaluates one arithmetic expression and returns the result as text."""

    name = "Calculator"
    description = "Evaluates an arithmetic expression exactly. Input must be the expression alone, e.g. 12*(3+4)."

    async def run(self, query: str) -> str:
        return format_number(evaluate(query))


def _eval(node: ast.expr) -> Number:
    if isinstance(node, ast.Constant):
        # bool is an int subclass and complex is a number; neither belongs in arithmetic input.
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise ValueError(f"not allowed in an arithmetic expression: literal {node.value!r}")
        return _checked(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _binary(node.op, _eval(node.left), _eval(node.right))
    raise ValueError(f"not allowed in an arithmetic expression: {_describe(node)}")


def _binary(op: ast.operator, left: Number, right: Number) -> Number:
    if isinstance(op, ast.Pow):  # refuse a huge power from the operands' sizes alone, before computing it
        if abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {format_number(right)} is larger than {MAX_EXPONENT} in absolute value")
        if abs(left) > 1 and right > 0 and right * math.log10(abs(left)) > MAX_DIGITS:
            raise ValueError(f"result would have more than {MAX_DIGITS} digits")
    try:
        result = _BINARY[type(op)](left, right)
    except ZeroDivisionError as exc:
        raise ValueError("division by zero") from exc
    except OverflowError as exc:
        raise ValueError("result too large") from exc
    if isinstance(result, complex):
        raise ValueError("result is not a real number")
    return _checked(result)


def _checked(value: Number) -> Number:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("result too large")
    if isinstance(value, int) and value.bit_length() > MAX_DIGITS * math.log2(10):
        raise ValueError(f"result would have more than {MAX_DIGITS} digits")
    return value


def _describe(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return f"name {node.id!r}"
    if isinstance(node, ast.Call):
        return "function call"
    if isinstance(node, ast.Attribute):
        return f"attribute {node.attr!r}"
    if isinstance(node, ast.Tuple):
        return "a comma list (commas are only read as thousands separators, as in 1,234)"
    if isinstance(node, (ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare)):
        op = getattr(node, "op", None) or getattr(node, "ops", [None])[0]
        return f"operator {type(op).__name__}"
    return type(node).__name__
