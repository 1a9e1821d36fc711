"""Tiny diffusers DiTs with real key names and random weights, saved as a source checkpoint, and their inputs."""

from __future__ import annotations

from pathlib import Path

import torch

WAN_TINY = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=2,
    attention_head_dim=32,
    in_channels=16,
    out_channels=16,
    text_dim=64,
    freq_dim=64,
    ffn_dim=128,
    num_layers=2,
    cross_attn_norm=True,
    rope_max_seq_len=32,
)


def wan_model(**changes):
    """A tiny WanTransformer3DModel (dim 64, ffn 128, 2 blocks unless changed), random weights."""
    import diffusers

    return diffusers.WanTransformer3DModel(**{**WAN_TINY, **changes})


def wan(path: Path, layers: int = 2, seed: int = 0) -> Path:
    """A tiny WanTransformer3DModel saved in bf16 with diffusers' save_pretrained."""
    torch.manual_seed(seed)
    wan_model(num_layers=layers).to(torch.bfloat16).save_pretrained(path)
    return path


def wan_of_width(path: Path, image_dim: int | None = None, seed: int = 0, width: int = 32) -> Path:
    """A tiny diffusers Wan; `width` (model dim, = text dim and ffn/2) 64 suits every format's shape rules."""
    import diffusers

    WanTransformer3DModel = diffusers.WanTransformer3DModel

    torch.manual_seed(seed)
    model = WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=width // 2,
        in_channels=4,
        out_channels=4,
        text_dim=24 if width == 32 else width,
        freq_dim=16,
        ffn_dim=2 * width,
        num_layers=2,
        cross_attn_norm=True,
        image_dim=image_dim,
        added_kv_proj_dim=width if image_dim else None,
        rope_max_seq_len=32,
    ).to(torch.bfloat16)
    model.save_pretrained(path)
    return path


#: what `WanPipeline.from_pretrained` is given for the parts `wan_pipeline` leaves out: prompts come as embeddings
NO_TEXT = dict(text_encoder=None, tokenizer=None, transformer_2=None)


def wan_pipeline(path: Path) -> Path:
    """A tiny `WanPipeline` (`wan_model` in bf16, a tiny `AutoencoderKLWan`, a scheduler; no text encoder) saved."""
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline

    torch.manual_seed(0)
    vae = AutoencoderKLWan(
        base_dim=8, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True]
    )
    pipe = WanPipeline(
        tokenizer=None,
        text_encoder=None,
        transformer=wan_model().to(torch.bfloat16),
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
    )
    pipe.save_pretrained(path)
    return path


def kandinsky5(path: Path, text_blocks: int = 1, visual_blocks: int = 2, seed: int = 0) -> Path:
    """A tiny Kandinsky5Transformer3DModel (dim 64, ff 128), saved in bf16 with diffusers' save_pretrained."""
    import diffusers

    torch.manual_seed(seed)
    model = diffusers.Kandinsky5Transformer3DModel(
        in_visual_dim=16,
        in_text_dim=64,
        in_text_dim2=64,
        time_dim=64,
        out_visual_dim=16,
        patch_size=(1, 2, 2),
        model_dim=64,
        ff_dim=128,
        num_text_blocks=text_blocks,
        num_visual_blocks=visual_blocks,
        axes_dims=(8, 12, 12),
    )
    model.to(torch.bfloat16).save_pretrained(path)
    return path


def wan_inputs(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return dict(
        hidden_states=torch.randn(1, 16, 2, 8, 8, generator=g).to(torch.bfloat16),
        timestep=torch.tensor([500]),
        encoder_hidden_states=torch.randn(1, 8, 64, generator=g).to(torch.bfloat16),
        return_dict=False,
    )


def kandinsky5_inputs(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return dict(
        hidden_states=torch.randn(1, 2, 8, 8, 16, generator=g).to(torch.bfloat16),
        encoder_hidden_states=torch.randn(1, 6, 64, generator=g).to(torch.bfloat16),
        timestep=torch.tensor([500.0]),
        pooled_projections=torch.randn(1, 64, generator=g).to(torch.bfloat16),
        visual_rope_pos=(torch.arange(2), torch.arange(4), torch.arange(4)),
        text_rope_pos=torch.arange(6),
        return_dict=False,
    )
