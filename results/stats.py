"""
The statistics of the studies (results/numbers_*.py), from scipy.stats, the field's library, so that no quantile is
typed by hand: the paired differences over seeds, their t interval and paired t test (t.ppf, ttest_rel), the exact
sign-flip permutation test and a bootstrap interval for a metric bounded at 0 and often exactly 0 (ζ: permutation_test,
bootstrap), Holm's step-down correction across a family of tests, and the smallest difference the seeds detect at a
power (the noncentral t).

    mean, low, high = t_interval(values)            # two-sided 95% t interval of the mean (n − 1 degrees of freedom)
    p = t_p(diff)                                   # paired t test of mean(diff) = 0 (ttest_rel of the pairs)
    p = sign_flip_p(diff)                           # exact: every one of the 2^n sign patterns of diff
    p = sign_flip_floor(n)                          # its smallest p at n pairs: 2/2^n, whatever the runs
    mean, low, high = bootstrap_interval(diff)      # percentile bootstrap of the mean, fixed generator
    adjusted = holm(ps)                             # Holm's adjusted p-values, in the input's order
    delta = detectable(sd, n, alpha)                # the |mean difference| the paired t test finds with 80% power
"""
import math

import numpy as np
from scipy import optimize, stats

LEVEL, POWER, BOOTSTRAPS = 0.95, 0.8, 9999


def mean_sd(values):
    m = sum(values) / len(values)
    return m, math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else float("nan")


def t_interval(values, level=LEVEL):
    """(mean, low, high): the two-sided t interval of the mean at this level."""
    m, sd = mean_sd(values)
    n = len(values)
    half = stats.t.ppf((1 + level) / 2, n - 1) * sd / math.sqrt(n) if n > 1 else float("nan")
    return m, m - half, m + half


def t_p(diff):
    """Two-sided p of the paired t test (ttest_rel) of the pairs (d_i, 0): mean(diff) = 0. All-equal differences: 0 if
    they are not 0, else 1 (the test's statistic is undefined there)."""
    if len(diff) < 2:
        return float("nan")
    if max(diff) == min(diff):
        return 0.0 if diff[0] else 1.0
    return float(stats.ttest_rel(np.asarray(diff, float), np.zeros(len(diff))).pvalue)


def sign_flip_p(diff):
    """Two-sided p of the exact paired permutation test of mean(diff) = 0: the share of the 2^n sign patterns of diff
    whose |mean| is at least the observed one (scipy's permutation_test over the pairs (d_i, 0), every pattern)."""
    d = np.asarray(diff, float)
    if not d.any():
        return 1.0
    res = stats.permutation_test((d, np.zeros_like(d)), lambda x, y, axis: np.mean(x - y, axis=axis),
                                 permutation_type="samples", n_resamples=np.inf, vectorized=True,
                                 alternative="two-sided")
    return float(res.pvalue)


def sign_flip_floor(n):
    """The smallest p the exact sign-flip test can give at n pairs: 2/2^n (the observed pattern and its mirror, every
    difference of one sign). At 5 pairs 0.0625: no difference can pass 0.05, whatever the runs."""
    return 2 / 2 ** n


def bootstrap_interval(diff, level=LEVEL):
    """(mean, low, high): the percentile bootstrap interval of mean(diff), BOOTSTRAPS resamples of a fixed generator
    (the same numbers on every run); all-equal differences: (d, d, d)."""
    d = np.asarray(diff, float)
    if d.max() == d.min():
        return float(d[0]), float(d[0]), float(d[0])
    res = stats.bootstrap((d,), np.mean, confidence_level=level, n_resamples=BOOTSTRAPS, method="percentile",
                          rng=np.random.default_rng(0))
    return float(d.mean()), float(res.confidence_interval.low), float(res.confidence_interval.high)


def holm(ps):
    """Holm's step-down adjusted p-values, in the input's order: the i-th smallest × (m − i + 1), made monotone."""
    order, out, running = sorted(range(len(ps)), key=lambda i: ps[i]), [0.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
        out[i] = running
    return out


def t_power(delta, sd, n, alpha):
    """The power of the two-sided paired t test at level alpha, n pairs whose differences have mean delta and standard
    deviation sd: P(|T| > t_crit), T noncentral t with n − 1 degrees of freedom and noncentrality delta·√n/sd."""
    df, nc, crit = n - 1, delta * math.sqrt(n) / sd, stats.t.ppf(1 - alpha / 2, n - 1)
    far = stats.nct.cdf(-crit, df, nc)                         # the other tail: underflows (scipy: nan) far out
    return float(stats.nct.sf(crit, df, nc) + (0.0 if math.isnan(far) else far))


def detectable(sd, n, alpha=1 - LEVEL, power=POWER):
    """The smallest |mean difference| that the two-sided paired t test at level alpha detects with this power, given
    the differences' standard deviation sd over n pairs (nan: fewer than 2 pairs, or no spread)."""
    if n < 2 or not sd > 0:
        return float("nan")
    unit = sd / math.sqrt(n)                                   # the noncentrality of delta is delta / unit
    top = 4 * stats.t.ppf(1 - alpha / 2, n - 1) + 10           # power > 0.99 there for every n ≥ 2 and alpha ≤ 0.05
    return optimize.brentq(lambda nc: t_power(nc * unit, sd, n, alpha) - power, 0.0, top) * unit
