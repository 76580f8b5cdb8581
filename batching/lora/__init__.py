"""LoRA adapters in the engine: where their files come from, which are loaded, and per-row activation.

- `store.LoraSource`: reads `<name>.safetensors` from the adapter store (`file://` directly,
  anything else through a fetcher the caller injects: the worker builds an S3 one from
  `storage`, which `batching` may not import), checks the size limit and the file's rules
  (`core.lora_files`, from the header alone), parses it with safetensors (never a pickle) and
  refuses weights that are not finite.
- `cache.LoraCache`: adapters loaded onto the pipeline's modules without fusing, bounded LRU
  by count and bytes; adapters in use by running samples are never evicted.
- `row_deltas.RowLoras`: forward hooks on the LoRA layers that add each row's own low-rank
  delta at its own scale, so one forward carries rows with different adapters and none.
- `text_encoder`: an adapter's text-encoder weights (SD), injected with PEFT directly.
- `engine_loras.EngineLoras`: the engine's facade over the above (fetch, prepare, rows, encoding).

Torch is imported by `cache` and `row_deltas` only. Random-weight test adapters: `benchmarks.random_loras`.
"""
