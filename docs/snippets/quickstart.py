import mechsink
from mechsink.model import to_tokens
from mechsink.measure.census import census

MODEL = "smollm2-135m"
model = mechsink.load_model(MODEL)                       # a TransformerBridge (raw weights)
tokens = to_tokens(model, "The capital of France is", prepend_bos=True)
logits, cache = model.run_with_cache(tokens)
layer = model.cfg.n_layers // 2
pattern = cache[f"blocks.{layer}.attn.hook_pattern"]    # [batch, head, query, key]
print(f"layer {layer}, attention to position 0:", pattern[0, :, 1:, 0].mean(-1).round(decimals=2))
run = census(model, ["natural"], ["bos"], n=4, seq_len=32).run("natural", "bos")
print("sink rate:", round(run.sinks.rate, 3), "strongest heads:", run.sinks.top_heads(3))
