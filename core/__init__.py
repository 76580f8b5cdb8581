"""What the API, storage, the worker and the engine share, with no torch: the ground floor.

- `core.params`: a job's generation params (`GenerationParams`), their validation and limits,
  the compatibility key, priorities, finish-by deadlines;
- `core.families`: the model families and what a job may ask of each (`FAMILIES`);
- `core.builtin_models`: the built-in models' names, families, versions, trained sizes, and the note
  on a prompt outside a trained built-in's vocabulary (`core.shapes_vocabulary`);
- `core.image_inputs`: the rules and decoding of a job's input images;
- `core.step_cache`: the step-cache settings a job may ask for;
- `core.lora_files`: what a LoRA adapter file must be;
- `core.errors`: the one error hierarchy (`InvalidParamsError` names the field).

`core` imports the standard library, `settings`, Pillow and NumPy only; everything else
stands above it (tests/test_layering.py holds the table).
"""
