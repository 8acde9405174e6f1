"""Model names -> loaded TransformerBridges: real GGUF models, HF ids, random init, organisms.

``load_model(name)`` understands:

- a named model, one entry each in :mod:`~mechsink.model.zoo.entries` (``mechsink models``
  lists them): decoded from its GGUF once and cached as safetensors + config + tokenizer under
  ``<cache>/models/<name>/``, in the verified cache (:mod:`~mechsink.model.zoo.cache`: every
  file's size and sha256 recorded when written and checked on each load; a damaged, partial or
  missing conversion is rebuilt from its verified source, saying so on stderr; ``mechsink models
  --verify`` hashes all);
- ``random:gpt2-<size>`` / ``random:llama-<size>``: fresh standard initialisation from ``seed``
  (:mod:`~mechsink.model.zoo.random_init`);
- ``hf:<model id or local folder>``: any causal LM transformers can load;
- :func:`~mechsink.model.zoo.random_folder.write_random_hf_folder` writes a fresh model of any
  config (a large model's shapes) as a sharded ``hf:`` folder, one shard in memory at a time;
- ``organism:<folder>``: a checkpoint written by :func:`save_organism`
  (:mod:`~mechsink.model.zoo.organisms`).
"""

from mechsink.lazy import lazy_names

# name -> the module that defines it, imported on first use (`mechsink models` needs only
# the listing, not torch or transformers)
_LAZY = {
    "FAMILIES": "mechsink.model.zoo.random_init",
    "GGUF": "mechsink.model.zoo.gguf",
    "GPT2_EOT": "mechsink.model.zoo.tokenizer",
    "NAMED_MODELS": "mechsink.model.zoo.entries",
    "PATTERN_HELP": "mechsink.model.zoo.listing",
    "TOKENIZER_FILES": "mechsink.model.zoo.folders",
    "ZooEntry": "mechsink.model.zoo.entry",
    "check_tokenizer_files": "mechsink.model.zoo.folders",
    "config_of": "mechsink.model.zoo.load",
    "context_of": "mechsink.model.zoo.load",
    "conversion_problem": "mechsink.model.zoo.cache",
    "converted_dir": "mechsink.model.zoo.cache",
    "gguf_file": "mechsink.model.zoo.load",
    "gpt2_tokenizer": "mechsink.model.zoo.tokenizer",
    "gpt2_tokenizer_dir": "mechsink.model.zoo.tokenizer",
    "known_names": "mechsink.model.zoo.load",
    "list_models": "mechsink.model.zoo.listing",
    "load_model": "mechsink.model.zoo.load",
    "load_organism_hf": "mechsink.model.zoo.organisms",
    "load_weights": "mechsink.model.zoo.folders",
    "organism_folder": "mechsink.model.zoo.organisms",
    "organism_recipe": "mechsink.model.zoo.organisms",
    "random_config": "mechsink.model.zoo.random_init",
    "random_hf_model": "mechsink.model.zoo.random_init",
    "resolve_device": "mechsink.model.zoo.devices",
    "save_organism": "mechsink.model.zoo.organisms",
    "seeded_model": "mechsink.model.zoo.random_init",
    "write_random_hf_folder": "mechsink.model.zoo.random_folder",
}

__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())

__all__ = [
    "FAMILIES", "GGUF", "GPT2_EOT", "NAMED_MODELS", "PATTERN_HELP", "TOKENIZER_FILES", "ZooEntry",
    "check_tokenizer_files", "config_of", "context_of", "conversion_problem", "converted_dir",
    "gguf_file", "gpt2_tokenizer", "gpt2_tokenizer_dir", "known_names", "list_models",
    "load_model", "load_organism_hf", "load_weights", "organism_folder", "organism_recipe",
    "random_config", "random_hf_model", "resolve_device", "save_organism", "seeded_model",
    "write_random_hf_folder",
]
