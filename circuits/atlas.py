"""The sink atlas: every claim (C1-C7) on every model, with the same prompts and settings.

Methods: per model, one run of each claim's experiment (structural origin for C1-C4, the P0-sink
circuit for C5, the query-bias circuit dosed to full removal for C6 where the model has b_Q, a
random-init twin of the same architecture for C7) on the same n prompts of seq_len tokens and
the same seed, and the sink rate on every prompt suite x first-token variant. Each cell holds
the verdict, the criterion it was judged by and the evidence, linked to the run's folder under
OUT/<model>/. The computation is :func:`mechsink.experiments.atlas.run`; a rerun with the same
settings skips every model already done (no model load).

    python circuits/atlas.py --out runs/atlas [--models smollm2-135m qwen2.5-0.5b ...]
        [--n 8] [--seq-len 32]
"""

from mechsink.experiments.script import main

if __name__ == "__main__":
    main("atlas", __doc__)
