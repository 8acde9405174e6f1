import mechsink
from mechsink.interventions.edits import ablate, applied, attend_only_to_self
from mechsink.measure.sinks import sink_scores
from mechsink.interventions.readout import dominant_super_neuron
from mechsink.inputs.prompts import make_prompts

MODEL = "smollm2-135m"
model = mechsink.load_model(MODEL)
tokens = make_prompts(model, "natural", "bos", n=4, seq_len=32, seed=0).tokens
k, every_layer = 16, list(range(model.cfg.n_layers))


def sink_at(pos, edits=()):
    """Gu's sink score of key ``pos``, mean over layers and heads, with ``edits`` installed."""
    with applied(model, list(edits)):
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    return sink_scores(cache, position=pos).mean.mean().item()


self_only = attend_only_to_self(model, every_layer, k)      # position k sees only itself
print(f"key {k}: {sink_at(k):.3f} -> {sink_at(k, self_only):.3f} with a self-only mask at {k}")
print(f"key 0:  {sink_at(0):.3f} -> {sink_at(0, self_only):.3f}")

sn = dominant_super_neuron(model, tokens)                   # .layer, .neuron, .channel, .name
silenced = ablate(model, f"{sn.name}@0", mode="scale", scale=0.0)  # e.g. L3N1229@0: that
print(f"super neuron {sn.name} -> channel {sn.channel}; key 0 with it "  # neuron at position 0
      f"silenced: {sink_at(0, [silenced]):.3f}")
