"""Does head-wise RMSNorm speed convergence and change the sink?

Methods: twin organisms (same recipe, seed, data and steps) with and without head-wise RMSNorm,
over several seeds; loss curves and sink timelines side by side; a paired verdict. The
computation is :func:`mechsink.experiments.headwise_rmsnorm.run`; the organisms are trained
under OUT/runs (an interrupted run resumes).

    python circuits/headwise_rmsnorm.py --out runs/hwrms [--recipe bb-gpt2-tiny] [--steps 2000]
"""

from mechsink.experiments.script import main

if __name__ == "__main__":
    main("headwise_rmsnorm", __doc__)
