"""A small PromQL evaluator for the dashboard tests: instant queries over one scrape.

It knows what the dashboard's gauge panels are written in and no more: selectors with label
matchers (``=``, ``!=``, ``=~``, ``!~``, regexes anchored as in Prometheus), ``sum``, ``max``,
``min``, ``avg`` and ``count`` with ``by``/``without``, ``+ - * /`` between vectors (one-to-one
on all labels but the name) or with numbers, comparisons as filters, ``or`` and ``vector(n)``.
Range selectors and functions over time (``rate``, ``increase``, ``histogram_quantile``) raise
``Unsupported``: a single scrape has no rates.

Samples are what Prometheus would store after scraping several targets: each target's series
with the target's own labels (``instance``, ``namespace``, ...) added.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

Labels = frozenset[tuple[str, str]]
Vector = dict[Labels, float]
Value = Vector | float

NAME = "__name__"


class Unsupported(ValueError):
    """The expression uses PromQL this evaluator does not know."""


def scrape(text: str, target: Mapping[str, str]) -> Vector:
    """Samples of one /metrics text, with the target's labels added (they win, as by default)."""
    out: Vector = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = {**sample.labels, **target, NAME: sample.name}
            out[frozenset(labels.items())] = sample.value
    return out


def merge(*scrapes: Vector) -> Vector:
    """The series of several targets, as one Prometheus holds them."""
    out: Vector = {}
    for one in scrapes:
        clash = out.keys() & one.keys()
        assert not clash, f"two targets gave the same series: {sorted(clash)[:3]}"
        out.update(one)
    return out


_TOKEN = re.compile(
    r"""\s*(?:
        (?P<number>\d+(?:\.\d*)?(?:[eE][+-]?\d+)?)
      | (?P<string>"(?:[^"\\]|\\.)*")
      | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
      | (?P<op>=~|!~|==|!=|>=|<=|[-+*/(){}\[\],=<>])
    )""",
    re.VERBOSE,
)


def _tokens(expr: str) -> list[str]:
    out, pos = [], 0
    expr = expr.rstrip()
    while pos < len(expr):
        found = _TOKEN.match(expr, pos)
        if not found or found.end() == pos:
            raise Unsupported(f"cannot read {expr[pos:]!r}")
        out.append(found.group().strip())
        pos = found.end()
    return out


AGGREGATIONS: dict[str, Callable[[list[float]], float]] = {
    "sum": sum,
    "max": max,
    "min": min,
    "count": len,
    "avg": lambda values: sum(values) / len(values),
}
COMPARISONS: dict[str, Callable[[float, float], bool]] = {
    ">": lambda a, b: a > b,
    "<": lambda a, b: a < b,
    ">=": lambda a, b: a >= b,
    "<=": lambda a, b: a <= b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
}
ARITHMETIC: dict[str, Callable[[float, float], float]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a / b if b else (float("nan") if a == 0 else float("inf") * a),
}


def _without_name(labels: Labels) -> Labels:
    return frozenset(item for item in labels if item[0] != NAME)


def _match(value: str, op: str, want: str) -> bool:
    if op == "=":
        return value == want
    if op == "!=":
        return value != want
    hit = re.fullmatch(want, value) is not None
    return hit if op == "=~" else not hit


@dataclass
class _Parser:
    tokens: list[str]
    samples: Vector
    pos: int = 0

    def peek(self) -> str:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else ""

    def take(self, want: str | None = None) -> str:
        token = self.peek()
        if want is not None and token != want:
            raise Unsupported(f"expected {want!r} at {' '.join(self.tokens[self.pos :])!r}")
        self.pos += 1
        return token

    def expr(self) -> Value:
        left = self.comparison()
        while self.peek() == "or":
            self.take()
            left = _or(left, self.comparison())
        return left

    def comparison(self) -> Value:
        left = self.additive()
        if self.peek() in COMPARISONS:
            op = self.take()
            if self.peek() == "bool":
                raise Unsupported("bool modifier")
            left = _binary(left, self.additive(), op)
        return left

    def additive(self) -> Value:
        left = self.multiplicative()
        while self.peek() in ("+", "-"):
            op = self.take()
            left = _binary(left, self.multiplicative(), op)
        return left

    def multiplicative(self) -> Value:
        left = self.unary()
        while self.peek() in ("*", "/"):
            op = self.take()
            left = _binary(left, self.unary(), op)
        return left

    def unary(self) -> Value:
        token = self.peek()
        if token == "(":
            self.take()
            inner = self.expr()
            self.take(")")
            return inner
        if re.fullmatch(r"\d.*", token):
            return float(self.take())
        if token in AGGREGATIONS:
            return self.aggregation()
        if token == "vector":
            self.take()
            self.take("(")
            number = self.unary()
            self.take(")")
            if not isinstance(number, float):
                raise Unsupported("vector() of a vector")
            return {frozenset(): number}
        if re.fullmatch(r"[A-Za-z_:][A-Za-z0-9_:]*", token):
            if self.tokens[self.pos + 1 : self.pos + 2] == ["("]:
                raise Unsupported(f"function {token}")
            return self.selector()
        raise Unsupported(f"unexpected {token!r}")

    def grouping(self) -> tuple[str, list[str]] | None:
        if self.peek() not in ("by", "without"):
            return None
        kind = self.take()
        self.take("(")
        names = []
        while self.peek() != ")":
            names.append(self.take())
            if self.peek() == ",":
                self.take()
        self.take(")")
        return kind, names

    def aggregation(self) -> Vector:
        fold = AGGREGATIONS[self.take()]
        grouping = self.grouping()
        self.take("(")
        inner = self.expr()
        self.take(")")
        grouping = grouping or self.grouping() or ("by", [])
        if not isinstance(inner, dict):
            raise Unsupported("aggregation over a number")
        kind, names = grouping
        groups: dict[Labels, list[float]] = {}
        for labels, value in inner.items():
            if kind == "by":
                key = frozenset(item for item in labels if item[0] in names)
            else:
                key = frozenset(item for item in labels if item[0] not in (*names, NAME))
            groups.setdefault(key, []).append(value)
        return {key: float(fold(values)) for key, values in groups.items()}

    def selector(self) -> Vector:
        matchers = [(NAME, "=", self.take())]
        if self.peek() == "{":
            self.take()
            while self.peek() != "}":
                label, op, quoted = self.take(), self.take(), self.take()
                if op not in ("=", "!=", "=~", "!~") or not quoted.startswith('"'):
                    raise Unsupported(f"matcher {label}{op}{quoted}")
                matchers.append((label, op, quoted[1:-1].encode().decode("unicode_escape")))
                if self.peek() == ",":
                    self.take()
            self.take("}")
        if self.peek() == "[":
            raise Unsupported("range selector")
        return {
            labels: value
            for labels, value in self.samples.items()
            if all(_match(dict(labels).get(k, ""), op, want) for k, op, want in matchers)
        }


def _binary(left: Value, right: Value, op: str) -> Value:
    compare = COMPARISONS.get(op)
    if isinstance(left, float) and isinstance(right, float):
        return float(compare(left, right)) if compare else ARITHMETIC[op](left, right)
    if compare is not None:
        if isinstance(left, dict) and isinstance(right, float):
            return {k: v for k, v in left.items() if compare(v, right)}
        if isinstance(left, dict) and isinstance(right, dict):
            by_key = {_without_name(k): v for k, v in right.items()}
            return {
                k: v
                for k, v in left.items()
                if _without_name(k) in by_key and compare(v, by_key[_without_name(k)])
            }
        raise Unsupported("number compared with a vector")
    arith = ARITHMETIC[op]
    if isinstance(left, dict) and isinstance(right, float):
        return {_without_name(k): arith(v, right) for k, v in left.items()}
    if isinstance(left, float) and isinstance(right, dict):
        return {_without_name(k): arith(left, v) for k, v in right.items()}
    assert isinstance(left, dict) and isinstance(right, dict)
    lhs = _one_to_one(left)
    rhs = _one_to_one(right)
    return {k: arith(v, rhs[k]) for k, v in lhs.items() if k in rhs}


def _one_to_one(vector: Vector) -> Vector:
    out: Vector = {}
    for labels, value in vector.items():
        key = _without_name(labels)
        if key in out:  # Prometheus refuses: "many-to-many matching not allowed"
            raise ValueError(f"found duplicate series for the match group {sorted(key)}")
        out[key] = value
    return out


def _or(left: Value, right: Value) -> Vector:
    if not isinstance(left, dict) or not isinstance(right, dict):
        raise Unsupported("or between numbers")
    seen = {_without_name(k) for k in left}
    return {**left, **{k: v for k, v in right.items() if _without_name(k) not in seen}}


def evaluate(expr: str, samples: Vector, variables: Mapping[str, str] | None = None) -> Value:
    """The instant value of ``expr`` over ``samples``, Grafana's ``$variables`` replaced first."""
    for name, value in sorted((variables or {}).items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(f"${{{name}}}", value).replace(f"${name}", value)
    if "$" in expr:
        raise Unsupported(f"unreplaced variable in {expr!r}")
    parser = _Parser(_tokens(expr), samples)
    value = parser.expr()
    if parser.peek():
        raise Unsupported(f"left over: {' '.join(parser.tokens[parser.pos :])!r}")
    return value


def labelled(vector: Value, *names: str) -> dict[tuple[str, ...], float]:
    """A vector's values keyed by the given labels' values (for assertions)."""
    assert isinstance(vector, dict), vector
    out: dict[tuple[str, ...], float] = {}
    for labels, value in vector.items():
        key = tuple(dict(labels).get(n, "") for n in names)
        assert key not in out, f"two series for {key}"
        out[key] = value
    return out


def names_in(exprs: Iterable[str]) -> set[str]:
    """Every gpushare series name the expressions mention."""
    return {name for expr in exprs for name in re.findall(r"gpushare_\w+", expr)}
