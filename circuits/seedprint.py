"""Structure at random initialisation, and SeedPrint (Li, Tong, Wang et al. 2026).

Methods: token preference on random input across families, depths and init schemes; the
contraction direction across seeds and inputs; SeedPrint between organisms that share or do not
share an initialisation; SeedPrint's threshold calibrated on a null of independent
initialisations trained on the same data, with false-positive and false-negative rates on
held-out organisms. The computation is :func:`mechsink.experiments.seedprint.run`; the
organisms are trained under OUT/runs.

    python circuits/seedprint.py --out runs/seedprint [--steps 200] [--null-inits 6]
        [--held-out-inits 4] [--alpha 0.01]
"""

from mechsink.experiments.script import main

if __name__ == "__main__":
    main("seedprint", __doc__)
