from pathlib import Path

import mechsink
from mechsink.model import to_tokens
from mechsink.measure.sinks import sink_scores
from mechsink.patching import SinkScore, path_patch

MODEL = "smollm2-135m"
OUT = Path("out")
model = mechsink.load_model(MODEL)
tokens = to_tokens(model, "The quick brown fox jumps over the lazy dog because it was",
                   prepend_bos=True)

# the target: the strongest sink head beyond block 0 that is not saturated (score < 0.95; a head
# at 1.0 cannot show a change), on this very prompt
_, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
score = sink_scores(cache).mean  # [layer, head]: Gu's score of key 0
score[0] = -1
score[score >= 0.95] = -1
layer, head = divmod(int(score.argmax()), model.cfg.n_heads)
print(f"target: L{layer}H{head}, sink score {float(score[layer, head]):.3f}")

# senders: every MLP below the target and every layer-0 head, at position 0 only; receiver: the
# target's keys. A sender's position-0 output is replaced by its mean over positions 1..
senders = [f"MLP{b}@0" for b in range(layer)] + [f"L0H{h}@0" for h in range(model.cfg.n_heads)]
for scales in ("recomputed", "frozen"):
    result = path_patch(model, tokens, None, senders, [f"L{layer}H{head}.k"],
                        SinkScore(layer=layer, head=head), ablation="position_mean",
                        scales=scales)
    effect = result.values - result.clean_value
    top = sorted(zip(senders, effect.tolist()), key=lambda t: t[1])[:4]
    print(f"scales={scales}: clean {result.clean_value:.3f};",
          "largest drops:", ", ".join(f"{s} {d:+.3f}" for s, d in top))
    result.to_json(OUT / f"path_{scales}.json")
