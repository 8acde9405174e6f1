"""When does the sink form during training? The sink measurements at every checkpoint.

Methods: every checkpoint of a run written by `mechsink train` reads the same held-out task
sequences; Gu's sink rate, the largest sink score, the first-token norm ratio and the largest
residual activation per checkpoint. The computation is
:func:`mechsink.experiments.sink_timeline.run`.

    mechsink train bb-gpt2-tiny --out runs/bb   # about 6000 steps; sinks form in layer 0
    python circuits/sink_timeline.py --run-dir runs/bb --out runs/bb-timeline
"""

from mechsink.experiments.script import main

if __name__ == "__main__":
    main("sink_timeline", __doc__)
