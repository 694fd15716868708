"""Fit the Chebyshev coefficients of minicomp's erfc (minicomp/ir/ops/mathtext.py `ERFCX`).

    .venv/bin/python scripts/fit_erfc.py      # prints the coefficients and the fit's error

For x >= 0.5, erfc(x) = exp(-x*x) * erfcx(x), and erfcx(x) * (x + K) is a smooth function of
t = (x - K) / (x + K) on [t(0.5), 1] (t = 1 is x = inf, where it tends to 1/sqrt(pi)). The
coefficients are a least-squares Chebyshev fit on that interval (mapped to [-1, 1]) against
mpmath's erfc at 40 digits: degree 10 for fp32 kernels, 20 for fp64. mpmath comes with torch
(through sympy); this script is not needed at run time.
"""

import mpmath
import numpy as np
from numpy.polynomial import chebyshev

X0, K = 0.5, 3.0
DEGREES = {"fp32": 10, "fp64": 20}


def main() -> None:
    mpmath.mp.dps = 40
    t0 = (X0 - K) / (X0 + K)
    n = 3000
    u = np.cos(np.pi * (np.arange(n) + 0.5) / n)
    t = t0 + (u + 1) / 2 * (1 - t0)

    def scaled(tt: float) -> float:
        if tt >= 1:
            return 1 / np.sqrt(np.pi)
        x = mpmath.mpf(K) * (1 + mpmath.mpf(tt)) / (1 - mpmath.mpf(tt))
        return float(mpmath.erfc(x) * mpmath.exp(x * x) * (x + K))

    ys = np.array([scaled(tt) for tt in t])
    xs = np.concatenate([np.linspace(0.5, 30, 4000), np.geomspace(30, 1e10, 300)])
    ref = np.array([float(mpmath.erfc(mpmath.mpf(x)) * mpmath.exp(mpmath.mpf(x) ** 2)) for x in xs])
    uu = 2 * ((xs - K) / (xs + K) - t0) / (1 - t0) - 1
    print(f"u = {2 / (1 - t0)!r} * t + {-2 * t0 / (1 - t0) - 1!r}")
    for name, deg in DEGREES.items():
        c = chebyshev.chebfit(u, ys, deg)
        err = np.max(np.abs(chebyshev.chebval(uu, c) / (xs + K) / ref - 1))
        print(f"{name}: degree {deg}, max relative error of erfcx {err:.2e}")
        print("   ", [float(v) for v in c])


if __name__ == "__main__":
    main()
