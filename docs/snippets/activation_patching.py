from pathlib import Path

import mechsink
from mechsink.model import to_tokens
from mechsink.patching import LogitDiff, activation_patch
from mechsink.viz.patching import heatmap

MODEL = "smollm2-135m"
OUT = Path("out")
model = mechsink.load_model(MODEL)
clean = "The Eiffel Tower is in the city of"
corrupted = "The Colosseum is in the city of"
paris, rome = (int(to_tokens(model, w, prepend_bos=False)[0, 0]) for w in (" Paris", " Rome"))
metric = LogitDiff(correct=paris, incorrect=rome)      # logit(Paris) - logit(Rome), last position

# denoise: run the corrupted prompt, patch in the clean residual stream, one (layer, pos) at a time
result = activation_patch(model, clean, corrupted, "resid_pre", metric, normalize=True,
                          prepend_bos=True)
print(f"logit diff: clean {result.clean_value:.3f}, corrupted {result.corrupted_value:.3f}")
print(result.to_frame().sort_values("value", ascending=False).head(5).to_string(index=False))
result.to_json(OUT / "resid_pre.json")                 # the data; the figure is drawn from it
heatmap(OUT / "resid_pre.json").savefig(OUT / "resid_pre.png", dpi=110)
