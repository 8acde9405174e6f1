"""Claim C7 as its paper states it (Li, Tong, Wang et al. 2026, "SeedPrint").

Methods: (i) on random-init twins of real architectures, token preference (max / median mean
next-token probability on random input) after every depth and at several init scales, and the
contraction per layer (mean pairwise cosine across sequences and within a sequence); (ii)
SeedPrint between organisms sharing or not sharing an initialisation, calibrated on a null of
independent initialisations; (iii) position 0's discrepancy in the within-sequence contraction
at init, and organisms trained from initialisations with W_O's init scaled by 0 (discrepancy
removed), 1 and more (amplified), the sink over training with intervals over seeds. The
computation is :func:`mechsink.experiments.init_structure.run`; the organisms are trained under
OUT/runs.

    python circuits/init_structure.py --out runs/init_structure [--steps 600] [--seeds 0 1 2]
        [--twins smollm2-135m gemma3-270m qwen2.5-0.5b] [--wo-scales 0 1 16]
"""

from mechsink.experiments.script import main

if __name__ == "__main__":
    main("init_structure", __doc__)
