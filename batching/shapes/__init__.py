"""builtin:shapes: a small trained model that draws "a <colour> <shape> on a <colour> background".

The parts: `vocabulary` (the colours, shapes and prompt grammar, one place), `drawing`
(the procedural images it is trained on), `checker` (decides from pixels whether an
image shows what a prompt asked for), `model` (the untrained pipeline's configs) and
`train` (reproduces the shipped weights from a seed). Everything but `model` and
`train` is torch-free, so the checker runs anywhere numpy and Pillow do.
"""
