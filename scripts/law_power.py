#!/usr/bin/env python3
"""The power of a χ² law audit, for sizing one (docs/testing.md, "How the law audits are sized").

An audit of CELLS cells at N samples, against a law at χ² divergence d = Σ (q − p)² / p from
the exact one, has about the power of a noncentral χ² with CELLS − 1 degrees of freedom and
noncentrality N·d. This prints the noncentrality that the wanted power needs at the audit's
false-failure probability, and the smallest divergence N samples detect with it; given the
p-value a wrong rule got at some sample count, it prints that rule's divergence.

    scripts/law_power.py --cells 27 --samples 50000
    scripts/law_power.py --cells 81 --p-value 2e-9 --at 25000

mpmath comes with torch (through sympy), so `make pydeps` installs it.
"""

import argparse

import mpmath as mp

mp.mp.dps = 40


def tail(x, dof):
    """P(X > x) for a central χ² of `dof` degrees of freedom."""
    return mp.gammainc(mp.mpf(dof) / 2, x / 2, mp.inf, regularized=True)


def noncentral_tail(x, dof, noncentrality):
    """P(X > x) for a noncentral χ²: a Poisson(noncentrality / 2) mixture of central tails."""
    half = mp.mpf(noncentrality) / 2
    total, j = mp.mpf(0), 0
    while True:
        weight = mp.exp(-half) * half**j / mp.factorial(j)
        total += weight * tail(x, dof + 2 * j)
        if j > half and weight < mp.mpf("1e-30"):
            return total
        j += 1


def bisect(predicate, low, high):
    """The smallest x in [low, high] where the monotone `predicate` turns true."""
    low, high = mp.mpf(low), mp.mpf(high)
    for _ in range(200):
        middle = (low + high) / 2
        if predicate(middle):
            high = middle
        else:
            low = middle
    return high


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", type=int, required=True, help="cells of the audit (27 for 3 tokens of 3)")
    parser.add_argument("--samples", type=int, help="N: print the smallest divergence N detects")
    parser.add_argument("--false-failure", type=float, default=1e-3, help="the audit's threshold (default 1e-3)")
    parser.add_argument("--power", type=float, default=0.99, help="the wanted power (default 0.99)")
    parser.add_argument("--p-value", type=float, help="a wrong rule's p-value: print its divergence")
    parser.add_argument("--at", type=int, help="the samples that p-value was measured at")
    args = parser.parse_args()
    if args.cells < 2:
        parser.error("--cells must be at least 2")
    if (args.p_value is None) != (args.at is None):
        parser.error("--p-value and --at go together")
    if args.samples is None and args.p_value is None:
        parser.error("give --samples, or --p-value with --at")

    dof = args.cells - 1
    critical = bisect(lambda x: tail(x, dof) <= args.false_failure, 0, 100 * dof + 1000)
    needed = bisect(lambda lam: noncentral_tail(critical, dof, lam) >= args.power, 0, 10_000)
    print(f"{args.cells} cells: reject above χ² = {mp.nstr(critical, 6)} (false failure {args.false_failure})")
    print(f"power {args.power} needs a noncentrality of {mp.nstr(needed, 4)}")
    if args.samples is not None:
        print(f"at {args.samples} samples: detects divergence {mp.nstr(needed / args.samples, 3)} or more")
    if args.p_value is not None:
        statistic = bisect(lambda x: tail(x, dof) <= args.p_value, 0, 1_000_000)
        print(
            f"p = {args.p_value} at {args.at} samples: χ² = {mp.nstr(statistic, 6)}, "
            f"divergence about {mp.nstr((statistic - dof) / args.at, 3)}"
        )


if __name__ == "__main__":
    main()
