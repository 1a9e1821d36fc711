"""The bundled recipes, shipped as package data (see `quantize recipes`)."""
