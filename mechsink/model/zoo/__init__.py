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
- ``organism:<folder>``: a checkpoint written by :func:`save_organism`
  (:mod:`~mechsink.model.zoo.organisms`).
"""

from mechsink.model.zoo.cache import conversion_problem, converted_dir
from mechsink.model.zoo.devices import resolve_device
from mechsink.model.zoo.entries import NAMED_MODELS
from mechsink.model.zoo.entry import ZooEntry
from mechsink.model.zoo.folders import TOKENIZER_FILES, check_tokenizer_files, load_weights
from mechsink.model.zoo.gguf import GGUF
from mechsink.model.zoo.listing import list_models
from mechsink.model.zoo.load import (
    PATTERN_HELP,
    config_of,
    context_of,
    gguf_file,
    known_names,
    load_model,
)
from mechsink.model.zoo.organisms import (
    load_organism_hf,
    organism_folder,
    organism_recipe,
    save_organism,
)
from mechsink.model.zoo.random_init import FAMILIES, random_config, random_hf_model, seeded_model
from mechsink.model.zoo.tokenizer import GPT2_EOT, gpt2_tokenizer, gpt2_tokenizer_dir

__all__ = [
    "FAMILIES", "GGUF", "GPT2_EOT", "NAMED_MODELS", "PATTERN_HELP", "TOKENIZER_FILES", "ZooEntry",
    "check_tokenizer_files", "config_of", "context_of", "conversion_problem", "converted_dir",
    "gguf_file", "gpt2_tokenizer", "gpt2_tokenizer_dir", "known_names", "list_models",
    "load_model", "load_organism_hf", "load_weights", "organism_folder", "organism_recipe",
    "random_config", "random_hf_model", "resolve_device", "save_organism", "seeded_model",
]
