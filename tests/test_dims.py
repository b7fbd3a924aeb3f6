"""Dimension expressions (dpl/ir/dims.py): the simplifier is sound on random expressions at
random bindings, equal polynomials are equal objects, text round-trips, the C form computes
what evaluate() does, solve() inverts linear dims, and bad text is reported by column."""

import functools
import pickle
import random
import subprocess

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import needs
from dpl.ir import dims as D
from dpl.ir.dims import DimError, DimExpr, DimSyntaxError, parse, text
from dpl.limits import LimitError

SYMBOLS = ("n", "m", "k")

# -- random expression trees -----------------------------------------------------------------
# A tree is a tuple: ("sym", name), ("const", c), (op, left, right) for add/sub/mul/min/max,
# (op, left, k) for floordiv/mod by a constant k, and ("sdiv"/"smod", left, right) for a
# symbolic divisor (which may be 0 at some bindings: those bindings are then skipped).

leaves = st.one_of(st.sampled_from(SYMBOLS).map(lambda s: ("sym", s)),
                   st.integers(-4, 9).map(lambda c: ("const", c)))
divisors = st.sampled_from([1, 2, 3, 4, 5, 6, 7, 8, -1, -2, -3])


def _extend(children):
    # scaled terms and offsets often, so that divisions meet coefficients and constants that
    # share factors with the divisor: (n * 6 + 2) % 4, (n // 2 + 1) // 3
    scaled = st.tuples(children, st.integers(-4, 8)).map(lambda t: ("mul", t[0], ("const", t[1])))
    shifted = st.tuples(children, st.integers(-6, 6)).map(lambda t: ("add", t[0], ("const", t[1])))
    return st.one_of(
        st.tuples(st.sampled_from(["add", "sub", "mul", "min", "max"]), children, children),
        scaled,
        st.tuples(st.sampled_from(["floordiv", "mod"]), st.one_of(children, scaled, shifted), divisors),
        st.tuples(st.sampled_from(["sdiv", "smod"]), children, children),
    )


trees = st.recursive(leaves, _extend, max_leaves=10)
polynomials = st.recursive(leaves, lambda c: st.tuples(st.sampled_from(["add", "sub", "mul"]), c, c), max_leaves=8)
bindings = st.lists(st.fixed_dictionaries({s: st.integers(0, 50) for s in SYMBOLS}), min_size=1, max_size=8)

BUILD = {"add": D.add, "sub": D.sub, "mul": D.mul, "min": D.dmin, "max": D.dmax,
         "floordiv": D.floordiv, "mod": D.mod, "sdiv": D.floordiv, "smod": D.mod}


def build(tree):
    """The tree built through dims' functions (so simplified at every step)."""
    kind = tree[0]
    if kind == "sym":
        return tree[1]
    if kind == "const":
        return tree[1]
    left = build(tree[1])
    right = tree[2] if kind in ("floordiv", "mod") else build(tree[2])
    return BUILD[kind](left, right)


def naive(tree, env):
    """The tree's value by plain Python arithmetic (None where it divides by zero)."""
    kind = tree[0]
    if kind == "sym":
        return env[tree[1]]
    if kind == "const":
        return tree[1]
    a = naive(tree[1], env)
    b = tree[2] if kind in ("floordiv", "mod") else naive(tree[2], env)
    if a is None or b is None:
        return None
    if kind in ("floordiv", "sdiv", "mod", "smod") and b == 0:
        return None
    return {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b,
            "min": lambda: min(a, b), "max": lambda: max(a, b),
            "floordiv": lambda: a // b, "sdiv": lambda: a // b,
            "mod": lambda: a % b, "smod": lambda: a % b}[kind]()


def built(tree):
    """build(tree); an example is rejected where it outgrows MAX_DIM_SIZE or divides by a
    divisor that simplifies to the constant 0 (which raises DimError when built)."""
    try:
        return build(tree)
    except (LimitError, DimError):
        assume(False)


def mirror(tree, rng):
    """An algebraically equal tree: operands of commutative ops swapped at random."""
    kind = tree[0]
    if kind in ("sym", "const"):
        return tree
    left = mirror(tree[1], rng)
    right = tree[2] if kind in ("floordiv", "mod") else mirror(tree[2], rng)
    if kind in ("add", "mul", "min", "max") and rng.random() < 0.5:
        left, right = right, left
    return (kind, left, right)


PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- (1) soundness ---------------------------------------------------------------------------


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees, bindings)
def test_simplification_is_sound(tree, envs):
    d = built(tree)
    assert isinstance(d, (int, str, DimExpr)) and type(d) is not bool
    for env in envs:
        expected = naive(tree, env)
        if expected is None:  # the original divides by zero here: any value is sound
            continue
        assert D.evaluate(d, env) == expected, (tree, text(d), env)


small_coefficients = st.sampled_from([1, 1, 1, 2, 3, 4, 6, -1, -2])
linear = st.lists(st.tuples(st.sampled_from(SYMBOLS), small_coefficients), min_size=1, max_size=2).map(
    lambda terms: functools.reduce(lambda a, b: ("add", a, b), [("mul", ("sym", s), ("const", c)) for s, c in terms]))


@st.composite
def divisions(draw):
    """One to three layers of ``(x * a + b [+ linear]) // k`` or ``% k`` over a linear form."""
    tree = draw(linear)
    for _ in range(draw(st.integers(1, 3))):
        tree = ("add", ("mul", tree, ("const", draw(small_coefficients))), ("const", draw(st.integers(-7, 7))))
        if draw(st.integers(0, 3)) == 0:
            tree = ("add", tree, draw(linear))
        tree = (draw(st.sampled_from(["floordiv", "mod"])), tree, draw(divisors))
    return tree


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(divisions(), bindings)
def test_divisions_of_linear_forms_are_sound(tree, envs):
    """Nested // and % by constants of scaled, shifted sums, where the division rules (gcd,
    nested floor division, nested modulo, folding by bounds) fire densely."""
    test_simplification_is_sound.hypothesis.inner_test(tree, envs)
    d = built(tree)
    assert parse(text(d)) == d


@PROPERTY
@given(trees, bindings)
def test_bounds_hold(tree, envs):
    d = built(tree)
    lo, hi = D.bounds(d)
    for env in envs:
        if naive(tree, env) is not None:
            assert lo <= D.evaluate(d, env) <= hi, (text(d), env, (lo, hi))


# -- (2) canonical form ----------------------------------------------------------------------

EQUAL = [
    ("n + n", "2 * n"),
    ("(n * 4) // 4", "n"),
    ("(n + 2) - 2", "n"),
    ("n * m", "m * n"),
    ("(n + m) * 2", "2 * m + n * 2"),
    ("(n + 1) * (n - 1)", "n * n - 1"),
    ("(n * 4 + 3) // 4", "n"),
    ("(n * 6 + m * 4) // 2", "n * 3 + m * 2"),
    ("(n * 6 + m * 3 + 1) // 3", "n * 2 + (m * 3 + 1) // 3"),
    ("(n * 4) % 4", "0"),
    ("(n * 4 + 5) % 4", "1"),
    ("n // 1", "n"),
    ("n % 1", "0"),
    ("n // 2 // 3", "n // 6"),
    ("(n // 2 + 1) // 3", "(n + 2) // 6"),
    ("n % 12 % 4", "n % 4"),
    ("n % 4 % 12", "n % 4"),
    ("n % 4 // 4", "0"),
    ("n // 4 * 4 + n % 4", "n"),
    ("(n - 3) // 2 + 1", "(n - 1) // 2"),
    ("(6 * n) // 4", "(3 * n) // 2"),
    ("(6 * n + 2) % 4", "(3 * n + 1) % 2 * 2"),
    ("max(n, n + 2)", "n + 2"),
    ("min(n, n + 2)", "n"),
    ("min(n, 0)", "0"),
    ("max(n, 0)", "n"),
    ("max(n % 4, 4)", "4"),
    ("min(n + 1, m + 1)", "min(m, n) + 1"),
    ("min(min(n, m), k)", "min(n, min(m, k))"),
    ("max(max(n, 3) + 1, m)", "max(n + 1, max(4, m))"),
    ("min(n, m) - min(m, n)", "0"),
    ("3 + 4", "7"),
    ("(n + 1) // (n + 1)", "1"),
    ("(n + 1) % (n + 2)", "n + 1"),
    ("(n * 2 + 5) // (n + 2)", "2"),
    ("(m + n) // n", "m // n + 1"),
]


@pytest.mark.parametrize("a, b", EQUAL)
def test_equal_by_algebra_compare_equal(a, b):
    x, y = parse(a), parse(b)
    assert x == y and hash(x) == hash(y), (text(x), text(y))
    assert D.provably_equal(x, y)


def test_simplest_of_three():
    assert D.floordiv(D.mul("n", 4), 4) == "n" and type(D.floordiv(D.mul("n", 4), 4)) is str
    assert D.add(3, 4) == 7 and type(D.add(3, 4)) is int
    assert D.sub(D.add("n", 2), 2) == "n"
    assert D.mul("n", 0) == 0 and type(D.mul("n", 0)) is int
    assert isinstance(D.add("n", 1), DimExpr)
    assert D.simplify(D.mul("n", 4) // 4) == "n"


def test_operators_on_dimexpr():
    n1 = D.add("n", 1)
    assert n1 + 1 == D.add("n", 2) and 1 + n1 == D.add("n", 2)
    assert "m" + n1 == D.add(D.add("m", "n"), 1)
    assert n1 - 1 == "n" and 10 - n1 == parse("9 - n")
    assert n1 * 2 == parse("2 * n + 2") and 2 * n1 == n1 * 2
    assert (n1 * 4) // 4 == n1 and (n1 * 4) % 4 == 0
    assert 7 // n1 == parse("7 // (n + 1)") and 7 % n1 == parse("7 % (n + 1)")
    assert -n1 == parse("-n - 1") and +n1 == n1


@PROPERTY
@given(trees, st.randoms(use_true_random=False))
def test_commuted_trees_are_equal(tree, rng):
    d = built(tree)
    e = built(mirror(tree, rng))
    assert d == e and hash(d) == hash(e), (text(d), text(e))


@PROPERTY
@given(trees, trees, trees)
def test_identities(ta, tb, tc):
    a, b, c = built(ta), built(tb), built(tc)
    try:
        assert D.add(a, 0) == a and D.mul(a, 1) == a and D.mul(a, 0) == 0
        assert D.sub(D.add(a, b), b) == a
        assert D.add(a, a) == D.mul(2, a)
        assert D.add(D.add(a, b), c) == D.add(a, D.add(b, c))
        assert D.mul(D.mul(a, b), c) == D.mul(a, D.mul(b, c))
        assert D.mul(a, D.add(b, c)) == D.add(D.mul(a, b), D.mul(a, c))
        for k in (1, 2, 3, 7):
            assert D.floordiv(D.mul(a, k), k) == a
            assert D.mod(D.mul(a, k), k) == 0
        assert D.dmin(a, a) == a and D.dmax(a, a) == a
        assert D.dmin(a, b) == D.dmin(b, a) and D.dmax(a, b) == D.dmax(b, a)
        assert D.dmin(D.dmin(a, b), c) == D.dmin(a, D.dmin(b, c))
        assert D.dmax(D.dmax(a, b), c) == D.dmax(a, D.dmax(b, c))
        assert D.simplify(a) == a
    except LimitError:
        assume(False)


@PROPERTY
@given(polynomials, st.integers(1, 8), st.integers(-3, 3), bindings)
def test_quotient_and_remainder_recombine(tree, k, t, envs):
    """``x // k * k + x % k == x``: structurally for a polynomial x (and its multiples), and by
    value for any x (the canonical form does not see it through every rewrite: after
    ``(n % 4) % 2 -> n % 2`` the halves no longer share an operand)."""
    x = built(tree)
    assert D.add(D.mul(D.floordiv(x, k), k), D.mod(x, k)) == x
    assert D.add(D.mul(D.floordiv(x, k), k * t), D.mul(D.mod(x, k), t)) == D.mul(x, t)


@PROPERTY
@given(trees, st.integers(1, 8), bindings)
def test_quotient_and_remainder_recombine_by_value(tree, k, envs):
    x = built(tree)
    y = D.add(D.mul(D.floordiv(x, k), k), D.mod(x, k))
    for env in envs:
        if naive(tree, env) is not None:
            assert D.evaluate(y, env) == D.evaluate(x, env)


def test_only_provable_min_max():
    assert isinstance(D.dmin("n", "m"), DimExpr)
    assert isinstance(D.dmin("n", 1), DimExpr)  # n may be 0
    assert isinstance(D.dmax(D.sub("n", 3), 0), DimExpr)  # n - 3 may be negative
    assert isinstance(D.dmin(D.floordiv("n", 2), D.sub("n", 1)), DimExpr)  # equal at n = 1, 2; differ at 0


# -- (3) text --------------------------------------------------------------------------------

PRINTED = [
    ("n*4+2", "n * 4 + 2"),
    ("(n - 3) // 2 + 1", "(n + 1) // 2 - 1"),
    ("min(64, n)", "min(n, 64)"),
    ("max(n, m) * 2", "max(m, n) * 2"),
    ("5 - n", "5 - n"),
    ("-n - 3", "-n - 3"),
    ("-3", "-3"),
    ("0 - n * 4", "-n * 4"),
    ("n // 2 * 4", "n // 2 * 4"),
    ("m * (n // 2)", "m * (n // 2)"),
    ("(n + m) % (m + 1)", "(m + n) % (m + 1)"),
    ("n * n * m + n + 1", "m * n * n + n + 1"),
    ("(n // 2) // m", "n // 2 // m"),
    ("n // (m // 2)", "n // (m // 2)"),
    ("-(n // 2)", "-(n // 2)"),
    ("min(n, min(m, k))", "min(k, min(m, n))"),
]


@pytest.mark.parametrize("source, printed", PRINTED)
def test_printed_form(source, printed):
    assert text(parse(source)) == printed
    assert parse(printed) == parse(source)
    assert str(parse(source)) == printed


@PROPERTY
@given(trees)
def test_text_round_trips(tree):
    d = built(tree)
    assert parse(text(d)) == d, text(d)
    assert pickle.loads(pickle.dumps(d)) == d


# -- (4) C -----------------------------------------------------------------------------------


def _random_tree(rng: random.Random, depth: int):
    if depth == 0 or rng.random() < 0.25:
        return ("sym", rng.choice(SYMBOLS)) if rng.random() < 0.6 else ("const", rng.randint(-4, 9))
    kind = rng.choice(["add", "sub", "mul", "min", "max", "floordiv", "mod", "floordiv", "mod", "sdiv", "smod"])
    if kind in ("floordiv", "mod"):
        return (kind, _random_tree(rng, depth - 1), rng.choice([1, 2, 3, 4, 5, 6, 7, 8, -2, -3]))
    return (kind, _random_tree(rng, depth - 1), _random_tree(rng, depth - 1))


def test_to_c_computes_what_evaluate_does(tmp_path):
    """One C program for 300 random expressions at 6 bindings each (compiled once)."""
    needs.c_compiler()
    rng = random.Random(32)
    exprs = []
    while len(exprs) < 300:
        try:
            exprs.append(build(_random_tree(rng, 4)))
        except (LimitError, DimError):
            continue
    envs = [{s: rng.randint(0, 50) for s in SYMBOLS} for _ in range(6)] + [{s: 0 for s in SYMBOLS}]
    functions, calls, expected = [], [], []
    for i, d in enumerate(exprs):
        functions.append(f"int64_t e{i}(int64_t n, int64_t m, int64_t k) {{ (void)n; (void)m; (void)k; "
                         f"return {D.to_c(d, lambda s: s)}; }}")
        for env in envs:
            try:
                value = D.evaluate(d, env)
            except DimError:  # a symbolic divisor is 0 here
                continue
            calls.append(f'    printf("%lld\\n", (long long)e{i}({env["n"]}, {env["m"]}, {env["k"]}));')
            expected.append(value)
    program = "\n".join([D.C_HELPERS, "#include <stdio.h>", *functions, "int main(void) {", *calls, "    return 0;", "}"])
    (tmp_path / "dims.c").write_text(program)
    subprocess.run(["cc", "-std=c99", "-O1", "-Wall", "-Werror", "-o", str(tmp_path / "dims"), str(tmp_path / "dims.c")],
                   check=True, capture_output=True, text=True)
    out = subprocess.run([str(tmp_path / "dims")], check=True, capture_output=True, text=True).stdout.split()
    assert len(out) == len(expected)
    wrong = [(text(exprs[int(c.split("(long long)e")[1].split("(")[0])]), c, got, want)
             for c, got, want in zip(calls, map(int, out), expected) if got != want]
    assert not wrong, wrong[:5]


def test_c_helpers_floor_negative_dividends(tmp_path):
    needs.c_compiler()
    cases = [(a, b) for a in range(-9, 10) for b in (-4, -3, -1, 1, 2, 3, 7)]
    body = "\n".join(f'    printf("%lld %lld\\n", (long long)dpl_floordiv({a}, {b}), (long long)dpl_mod({a}, {b}));' for a, b in cases)
    (tmp_path / "h.c").write_text(D.C_HELPERS + D.C_HELPERS + "#include <stdio.h>\nint main(void) {\n" + body + "\n    return 0;\n}\n")
    subprocess.run(["cc", "-Wall", "-Werror", "-o", str(tmp_path / "h"), str(tmp_path / "h.c")], check=True, capture_output=True)
    out = subprocess.run([str(tmp_path / "h")], check=True, capture_output=True, text=True).stdout.splitlines()
    assert [tuple(map(int, line.split())) for line in out] == [(a // b, a % b) for a, b in cases]


def test_to_c_names_symbols_through_the_callback():
    c = D.to_c(parse("(n - 3) // 2 + min(n, 64)"), lambda s: f"shape[{SYMBOLS.index(s)}]")
    assert "shape[0]" in c and "dpl_floordiv" in c and "dpl_min" in c and " n" not in c


# -- (5) solve -------------------------------------------------------------------------------


@given(st.integers(-9, 9).filter(bool), st.integers(-20, 20), st.integers(0, 50))
def test_solve_round_trips(a, b, value_of_n):
    d = D.add(D.mul(a, "n"), b)
    size = D.evaluate(d, {"n": value_of_n})
    assert D.solve(d, size) == {"n": value_of_n}


def test_solve():
    assert D.solve("n", 7) == {"n": 7}
    assert D.solve(parse("n * 4 + 2"), 42) == {"n": 10}
    assert D.solve(8, 8) == {}
    assert D.solve(parse("n * m"), 12) is None
    assert D.solve(parse("n // 2"), 3) is None
    assert D.solve(parse("n + m"), 3) is None
    with pytest.raises(DimError, match="not a multiple of 4"):
        D.solve(parse("n * 4 + 2"), 41)
    with pytest.raises(DimError, match="n = -1"):
        D.solve(parse("n + 5"), 4)
    with pytest.raises(DimError, match="expected a dimension of 8, got 9"):
        D.solve(8, 9)


# -- (6) errors ------------------------------------------------------------------------------

BAD = [
    ("n +", 4, "found the end"),
    ("n / 2", 3, "found '/'"),
    ("min(n)", 6, "expected ','"),
    ("max(n, m, k)", 9, "takes two arguments"),
    ("3 $ 4", 3, "found '$'"),
    ("", 1, "expected a dimension"),
    ("(n", 3, "expected ')'"),
    ("n m", 3, "found 'm'"),
    ("2 * * n", 5, "found '*'"),
    ("min + 1", 5, "expected '('"),
    ("n // 0", 3, "division by zero"),
]


@pytest.mark.parametrize("source, column, message", BAD)
def test_parse_errors_name_the_column(source, column, message):
    with pytest.raises(DimError) as info:
        parse(source)
    err = info.value
    assert message in err.message
    assert err.span is not None and err.span.col == column
    if isinstance(err, DimSyntaxError):
        assert f"column {column}" in err.message
    assert "^" in str(err)


def test_parse_columns_offset_into_a_line():
    with pytest.raises(DimSyntaxError) as info:
        parse("n ? 2", file="m.ir", line=3, column=10)
    assert str(info.value).startswith("m.ir:3:12: error:") and info.value.span.col == 12


def test_limits():
    with pytest.raises(LimitError, match="MAX_NESTING"):
        parse("(" * 200 + "n" + ")" * 200)
    with pytest.raises(LimitError, match="MAX_DIM_SIZE"):
        d = D.add("a", "b")
        for s in "cdefghij":
            d = D.mul(d, D.add(s, 1))
    with pytest.raises(LimitError, match="digits"):
        parse("1" * 40)


def test_bad_values_and_bindings():
    with pytest.raises(DimError, match="not a symbol name"):
        D.add("n m", 1)
    with pytest.raises(DimError, match="not a symbol name"):
        D.add("min", 1)
    with pytest.raises(DimError, match="not a dimension"):
        D.add(True, 1)
    with pytest.raises(DimError, match="not a dimension"):
        D.add(1.5, 1)
    with pytest.raises(DimError, match="division by zero"):
        D.floordiv("n", 0)
    with pytest.raises(DimError, match="'m' is not bound"):
        D.evaluate(parse("n + m"), {"n": 1})
    with pytest.raises(DimError, match=">= 0"):
        D.evaluate("n", {"n": -1})
    with pytest.raises(DimError, match="division by zero"):
        D.evaluate(parse("n // m"), {"n": 1, "m": 0})


def test_immutable_and_hashable():
    d = parse("n * 4 + 2")
    with pytest.raises(AttributeError):
        d.terms = ()
    assert {d: 1}[parse("2 + 4 * n")] == 1
    assert d != "n" and d != 2 and d != parse("n * 4 + 3")


# -- the rest of the API ---------------------------------------------------------------------


def test_free_symbols_and_substitute():
    d = parse("(n - 3) // 2 + min(m, 64)")
    assert D.free_symbols(d) == {"n", "m"} and D.free_symbols(7) == frozenset()
    assert D.substitute(d, {"n": 7, "m": 100}) == 66
    assert D.substitute(d, {"n": D.add("k", 3)}) == parse("k // 2 + min(m, 64)")
    assert D.substitute(parse("n * 4"), {"n": parse("m // 4")}) == parse("m // 4 * 4")
    assert D.provably_equal(parse("m // 4 * 4"), parse("m - m % 4"))


@PROPERTY
@given(trees, trees, bindings)
def test_substitute_is_sound(tree, replacement, envs):
    d, r = built(tree), built(replacement)
    try:
        s = D.substitute(d, {"n": r})
    except LimitError:
        assume(False)
    except DimError as err:  # the replacement makes a divisor the constant 0
        assert "by zero" in err.message
        assume(False)
    for env in envs:
        try:
            inner = D.evaluate(r, env)
        except DimError:
            continue
        assume(inner >= 0)  # symbols are sizes: substitute a size for n
        expected = naive(tree, {**env, "n": inner})
        if expected is not None:
            assert D.evaluate(s, env) == expected


def test_proofs():
    assert D.provably_nonnegative(parse("n * m + n % 3"))
    assert D.provably_nonnegative(parse("(n + 1) // 2"))
    assert not D.provably_nonnegative(parse("n - 1"))
    assert not D.provably_nonnegative(parse("n - n // 2"))  # true, but beyond interval bounds: sound, not complete
    assert D.provably_equal(parse("(n + 1) * (n + 1)"), parse("n * n + 2 * n + 1"))
    assert not D.provably_equal("n", "m")
    assert D.bounds(parse("n % 8 + 1")) == (1, 8)
