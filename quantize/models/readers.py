"""What the runtimes that read our files know of the families, in the words a family's refusal quotes.

ComfyUI-GGUF's Unet loader reads only the architectures of its ``IMG_ARCH_LIST`` (``loader.py`` at city96/ComfyUI-GGUF
e579b7e): a family outside it has no GGUF output, and its `PlanPolicy.no_gguf_why` says so.
"""

from __future__ import annotations

__all__ = ["COMFYUI_GGUF_ARCHITECTURES", "no_gguf_reader"]

#: ComfyUI-GGUF's IMG_ARCH_LIST
COMFYUI_GGUF_ARCHITECTURES = (
    "flux", "sd1", "sdxl", "sd3", "aura", "hidream", "cosmos", "ltxv", "hyvid", "wan", "lumina2", "qwen_image",
)  # fmt: skip


def no_gguf_reader(title: str) -> str:
    """Why a family ComfyUI-GGUF's loader does not know has no GGUF file, naming it (`title`)."""
    return (
        f"ComfyUI-GGUF's loader reads only the architectures of its IMG_ARCH_LIST "
        f"({', '.join(COMFYUI_GGUF_ARCHITECTURES)}), none of them {title}"
    )
