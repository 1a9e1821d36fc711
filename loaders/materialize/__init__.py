"""`load_quantized`: a converted checkpoint straight into a model, without a bf16 copy on the way.

Every format `quantize convert` writes loads: the diffusers-layout formats (sharded safetensors), ComfyUI's
(one safetensors file) and GGUF (one ``.gguf``), in either naming. A checkpoint in the family's native names
(ComfyUI's and GGUF's files, or a converted original release) goes into the family's diffusers class through
the family's one name table, read the other way (`models.Family.names`); a checkpoint whose names are the
model's loads as it is. A checkpoint of several models (Wan2.2 A14B's two experts) loads each. A native tensor
that stacks several of the class's (a fused q/k/v projection, `models.Stack`) gives each Linear its rows' parts
as the format cuts them (`Format.cut_rows`): ranges of the parts that have the weight's rows (a view of the file
when the range is one), the whole of the parts that belong to the whole weight (a per-tensor scale, ComfyUI's
marker), a part made for the cut (an nf4 quant state of its shape).

1. The skeleton: a class is built from the checkpoint's config.json (an original release's config is made the
   diffusers class's by its family) with its parameters on the meta device (buffers it computes itself, such
   as rotary tables, are built for real); a module passed in is filled in place.
2. The match, before any data is read: every Linear whose checkpoint entry is in the format's parts
   is swapped for that format's module (`loaders.modules`), with the options its stored parts say (gguf's
   GGML type of that layer); every checkpoint key must land on a parameter, buffer or part of the model with
   the same shape (or the same but for size-1 dims, viewed to the model's: `models.same_but_size_one_dims`), and
   every parameter must be given; what the family carries (`Family.carried`: a release's VAE, buffers the class
   computes) is left out. Any mismatch is one `CheckpointMismatchError` naming the key.
3. The data, module group by module group (the layers outside the blocks, then block by block):
   each tensor is taken from the safetensors file as the `host` mode says (a memory-map view, a
   pageable read, a pinned read) and assigned, or copied straight to `device`. Nothing else holds it,
   so the host peak is what stays resident, never twice it.

The package, one module a concern, in the order a load runs them:

- `discovery`: the model folders of a checkpoint (`find_components`, `find_component`), their files opened
  (`open_model_files`, headers only), the format each declares and whether a module here runs it;
- `skeleton`: step 1;
- `names`: the checkpoint's name of each model tensor (`_Names`), through the family's table where the namings
  differ, and the tied parameters;
- `match`: step 2, the plan (`_match`), the row cutting of stacked tensors (`_cut_entry`) and the options a
  Linear's stored parts say (`_stored_options`);
- `data`: step 3, and the dtypes the kept tensors load in;
- `load`: `load_quantized`, the entry; `errors`: `CheckpointMismatchError`.
"""

from __future__ import annotations

from quantize.models.meta import parameters_on_meta

from .discovery import find_component, find_components
from .discovery import open_model_files as open_model_files  # not in __all__, as before (benchmarks use it)
from .errors import CheckpointMismatchError
from .load import load_quantized

__all__ = [
    "load_quantized",
    "CheckpointMismatchError",
    "find_component",
    "find_components",
    "parameters_on_meta",
]
