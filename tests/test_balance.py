"""harness.balance: the backward's tiles dealt by the counter, simulated on the host."""
from harness import balance as B
from harness.problems import Problem, fuzz_problems


def _problem(seed, match):
    return next(p for p in fuzz_problems(40, seed) if match in p.label())


def test_even_shares_shorten_a_few_long_tiles():
    """Fuzz seed 2 B5 H8/1 D128 causal (17 tiles of a GQA group of eight heads): the span
    falls with every doubling of the parts, even shares below Q-block runs at 4 and 8
    parts, and the rule takes 8."""
    p = _problem(2, "self B5 H8/1 D128")
    even, runs = B.simulate(p), B.simulate(p, split="runs")
    assert even["rule"] == 8 and even[1] == 1.0
    assert even[8] < even[4] < even[2] < 1.0
    assert even[4] < runs[4] and even[8] < runs[8]


def test_counter_and_items():
    """The counter hands each item to the program that frees first, in list order; a
    tile's parts cover its steps once (the rule's fixed costs on top)."""
    assert B.span([3, 1, 1, 1], 2) == 3 and B.span([1, 1, 1, 3], 2) == 4
    p = Problem(batch=2, heads=4, kv_heads=1, head_dim=128, max_seqlen_q=300, causal=True)
    whole = B.items(p, 1, 64)
    for P in (2, 4, 8):
        parts = B.items(p, P, 64)
        fixed = B.BWD_PART_ROWS / 64
        assert len(parts) == P * len(whole)
        assert abs(sum(parts) - P * fixed * len(whole)
                   - (sum(whole) - B.BWD_TILE_STEPS * len(whole))) < 1e-6


def test_report_lines():
    """One line a problem that is split or would gain from it, broadcast-Q left out."""
    lines = list(B.report(fuzz_problems(40, 2)[:12]))
    assert lines[0].startswith("problem") and all("broadcast" not in x for x in lines)
    assert all(len(x.split()) >= 7 for x in lines[1:])
