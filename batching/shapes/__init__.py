"""builtin:shapes: a small trained model that draws "a <colour> <shape> on a <colour> background".

What loading and checking it needs: `core.shapes_vocabulary` (the colours, shapes and prompt
grammar, one place; in `core` so that the API can tell a prompt outside it), `drawing` (the
procedural images it is trained on, and the checker's test images), `checker` (decides from
pixels whether an image shows what a prompt asked for) and `accuracy` (the fixed cases, alone and
co-batched). The weights ship in `batching/assets/builtin-shapes/`; the untrained pipeline's
configs and the training that reproduces them from a seed are not serving code and live in
`training/shapes/`. The checker is torch-free, so it runs anywhere numpy and Pillow do.
"""
