"""results/stats.py, the studies' statistics: each against a case worked by hand and an independent computation (the
2^n sign patterns enumerated, the paired t statistic written out, a simulation of the power)."""
import itertools
import math
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results"))
import stats as S  # noqa: E402


def test_the_t_interval_uses_the_exact_quantile():
    """[1..5]: mean 3, sd √2.5, t(0.975, 4) = 2.7764451 (not a table's 2.776): half-width 1.9632432."""
    m, low, high = S.t_interval([1, 2, 3, 4, 5])
    assert m == 3 and high - m == pytest.approx(2.7764451052 * math.sqrt(2.5) / math.sqrt(5), abs=1e-9)
    assert low == pytest.approx(1.0367568385, abs=1e-9)


def test_the_paired_t_p_is_the_t_statistics_tail():
    """diff [1, 2, 3, 4, 6]: t = 3.2 / (1.9235 / √5) = 3.7199 with 4 degrees of freedom, p = 0.020476; all-equal
    differences are 0 (if not 0) or 1."""
    d = [1, 2, 3, 4, 6]
    m, sd = S.mean_sd(d)
    t = m / (sd / math.sqrt(5))
    assert t == pytest.approx(3.71991, abs=1e-4)
    assert S.t_p(d) == pytest.approx(0.0204759, abs=1e-6)
    assert S.t_p([0.5] * 4) == 0.0 and S.t_p([0.0] * 4) == 1.0


@pytest.mark.parametrize("diff,p", [([1, 2, 3], 2 / 8), ([1] * 5, 2 / 32), ([3, -1, 2, 0.5], 6 / 16)])
def test_the_sign_flip_test_is_exact(diff, p):
    """By hand: [1, 2, 3] has 8 sign patterns, only ±(1, 2, 3) reach |mean| 2: p = 2/8; [3, −1, 2, 0.5] (|sum| 4.5 of
    6.5): the 6 patterns whose flipped values sum to at most 1 or at least 5.5. Enumerated: every pattern."""
    assert S.sign_flip_p(diff) == pytest.approx(p)
    observed = abs(np.mean(diff))
    hits = [abs(np.mean([s * d for s, d in zip(signs, diff)])) >= observed - 1e-12
            for signs in itertools.product([1, -1], repeat=len(diff))]
    assert S.sign_flip_p(diff) == pytest.approx(sum(hits) / len(hits))
    assert S.sign_flip_p([0.0, 0.0, 0.0]) == 1.0


@pytest.mark.parametrize("n", [3, 5, 10])
def test_the_sign_flip_floor_is_the_smallest_p_at_n_pairs(n):
    """Differences all of one sign and distinct reach the floor 2/2^n (0.0625 at 5: above 0.05); any other pattern
    gives more."""
    assert S.sign_flip_p(list(range(1, n + 1))) == pytest.approx(S.sign_flip_floor(n)) == pytest.approx(2 / 2 ** n)
    assert S.sign_flip_p([-1] + list(range(2, n + 1))) > S.sign_flip_floor(n)


def test_the_bootstrap_interval_is_fixed_and_holds_the_mean():
    d = [0.5, -0.2, 1, 2, 0, 0, 3, 1, 1, 1]
    m, low, high = S.bootstrap_interval(d)
    assert m == pytest.approx(0.93) and min(d) <= low < m < high <= max(d)
    assert S.bootstrap_interval(d) == (m, low, high)                     # the same generator: the same numbers
    rng = np.random.default_rng(5)                                       # an independent percentile bootstrap
    means = np.asarray(d)[rng.integers(0, len(d), (40000, len(d)))].mean(1)
    assert (low, high) == pytest.approx(tuple(np.percentile(means, [2.5, 97.5])), abs=0.03)
    assert S.bootstrap_interval([0.0, 0.0]) == (0.0, 0.0, 0.0)


def test_holm_by_hand():
    """p = (0.01, 0.04, 0.03): 0.01·3 = 0.03; 0.03·2 = 0.06; 0.04·1 = 0.04, made monotone 0.06."""
    assert S.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert S.holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])


def test_the_detectable_difference_has_the_power_it_claims():
    """At the returned δ, simulated paired samples reject at 80%; for many pairs δ → (z_0.975 + z_0.8)·sd/√n."""
    delta = S.detectable(1.0, 10)
    assert S.t_power(delta, 1.0, 10, 0.05) == pytest.approx(0.8, abs=1e-6)
    rng = np.random.default_rng(1)
    x = rng.normal(delta, 1.0, (40000, 10))
    t = x.mean(1) / (x.std(1, ddof=1) / math.sqrt(10))
    from scipy.stats import t as student
    assert (abs(t) > student.ppf(0.975, 9)).mean() == pytest.approx(0.8, abs=0.01)
    assert S.detectable(1.0, 4000) * math.sqrt(4000) == pytest.approx(1.959964 + 0.841621, rel=1e-3)
    assert S.detectable(2.0, 10) == pytest.approx(2 * delta)                                   # it scales with sd
    assert S.detectable(1.0, 10, alpha=0.05 / 8) > delta and math.isnan(S.detectable(0.0, 10))
