"""Recipe texts the recipe and plan tests share."""

from __future__ import annotations

#: the smallest valid recipe: one format, one target (blocks' ffn.0), every other field its default
MINIMAL = "format: fp8_channel\ntargets: ['blocks\\.\\d+\\.ffn\\.0']\n"
