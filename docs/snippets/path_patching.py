from pathlib import Path

import mechsink
from mechsink.bridge import to_tokens
from mechsink.measure.sinks import sink_scores
from mechsink.patching import SinkScore, path_patch

MODEL = "smollm2-135m"
OUT = Path("out")
model = mechsink.load_model(MODEL)
tokens = to_tokens(model, "The quick brown fox jumps over the lazy dog because it was", prepend_bos=True)

# the strongest sink head beyond the first two blocks, on this very prompt
_, cache = model.run_with_cache(tokens)
n_heads, early = model.cfg.n_heads, min(2, model.cfg.n_layers - 1)  # early: blocks 0..early-1
score = sink_scores(cache).mean  # [layer, head]: Gu's score of key 0
score[:early] = -1
layer, head = divmod(int(score.argmax()), n_heads)
print(f"target: L{layer}H{head}, sink score {float(score[layer, head]):.3f}")

# senders: every head and MLP of the early blocks, at position 0 only; receiver: the target's
# keys. A sender's position-0 output is replaced by its mean over positions 1.. (an ordinary token).
senders = [f"L{b}H{h}@0" for b in range(early) for h in range(n_heads)]
senders += [f"MLP{b}@0" for b in range(early)]
for scales in ("recomputed", "frozen"):
    result = path_patch(model, tokens, None, senders, [f"L{layer}H{head}.k"],
                        SinkScore(layer=layer, head=head), ablation="position_mean",
                        scales=scales)
    effect = result.values - result.clean_value
    top = sorted(zip(senders, effect.tolist()), key=lambda t: t[1])[:4]
    print(f"scales={scales}: clean {result.clean_value:.3f};",
          "largest drops:", ", ".join(f"{s} {d:+.3f}" for s, d in top))
    result.to_json(OUT / f"path_{scales}.json")
