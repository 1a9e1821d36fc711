"""The curated recipes, shipped as package data: what a family's policy does not derive (per-layer mixes such as the
K-quant ``_M`` types and ConvRot, ``-all`` variants) and a few worked examples to copy, each equal to the derived
recipe of its name. `quantize recipes` lists these with every derived one."""
