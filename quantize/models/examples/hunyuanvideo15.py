"""HunyuanVideo 1.5's example checkpoints: one variant folder of the release (original names, q/k/v apart, its
config.json) and diffusers' ``transformer/``."""

from __future__ import annotations

from dataclasses import dataclass

from ..hunyuanvideo15 import HUNYUANVIDEO15, RELEASE_CLASS
from .base import ExampleModel, Examples, diffusers_example, linear

__all__ = ["HUNYUANVIDEO15_EXAMPLES", "HunyuanVideo15Shape", "release_tensors", "release_config"]


@dataclass(frozen=True)
class HunyuanVideo15Shape:
    """An example HunyuanVideo 1.5: its width and double blocks; the rest is what ComfyUI builds whatever the
    tensors say (heads of 128, two refiner blocks, the text, ByT5 and vision widths) and the release's channels
    (32 latent channels, the image latent and a mask beside the noise: 65 in)."""

    hidden_size: int
    num_layers: int
    in_channels: int = 65
    out_channels: int = 32
    text_dim: int = 3584
    byt5_dim: int = 1472
    vision_dim: int = 1152
    refiner_layers: int = 2
    mlp_ratio: int = 4
    head_dim: int = 128
    rope_axes: tuple[int, int, int] = (16, 56, 56)
    task: str = "t2v"
    resolution: str = "480p"

    @property
    def heads(self) -> int:
        return self.hidden_size // self.head_dim


def _norm(name: str, width: int) -> list[tuple[str, tuple[int, ...]]]:
    return [(f"{name}.weight", (width,)), (f"{name}.bias", (width,))]


def release_tensors(s: HunyuanVideo15Shape) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of the release's ``HunyuanVideo_1_5_DiffusionTransformer`` (q, k, v apart in the double
    blocks), in module order."""
    d, ff = s.hidden_size, s.mlp_ratio * s.hidden_size
    t = [("img_in.proj.weight", (d, s.in_channels, 1, 1, 1)), ("img_in.proj.bias", (d,))]
    t += linear("time_in.mlp.0", d, 256) + linear("time_in.mlp.2", d, d)
    t += linear("txt_in.input_embedder", d, s.text_dim)
    t += linear("txt_in.t_embedder.mlp.0", d, 256) + linear("txt_in.t_embedder.mlp.2", d, d)
    t += linear("txt_in.c_embedder.linear_1", d, s.text_dim) + linear("txt_in.c_embedder.linear_2", d, d)
    for i in range(s.refiner_layers):
        b = f"txt_in.individual_token_refiner.blocks.{i}"
        t += (
            _norm(f"{b}.norm1", d)
            + linear(f"{b}.self_attn_qkv", 3 * d, d)
            + linear(f"{b}.self_attn_proj", d, d)
        )
        t += _norm(f"{b}.norm2", d) + linear(f"{b}.mlp.fc1", ff, d) + linear(f"{b}.mlp.fc2", d, ff)
        t += linear(f"{b}.adaLN_modulation.1", 2 * d, d)
    t += _norm("byt5_in.layernorm", s.byt5_dim) + linear("byt5_in.fc1", 2048, s.byt5_dim)
    t += linear("byt5_in.fc2", 2048, 2048) + linear("byt5_in.fc3", d, 2048)
    t += _norm("vision_in.proj.0", s.vision_dim) + linear("vision_in.proj.1", s.vision_dim, s.vision_dim)
    t += linear("vision_in.proj.3", d, s.vision_dim) + _norm("vision_in.proj.4", d)
    t += [("cond_type_embedding.weight", (3, d))]
    for i in range(s.num_layers):
        b = f"double_blocks.{i}"
        for stream in ("img", "txt"):
            t += linear(f"{b}.{stream}_mod.linear", 6 * d, d)
            for x in "qkv":
                t += linear(f"{b}.{stream}_attn_{x}", d, d)
            t += [
                (f"{b}.{stream}_attn_q_norm.weight", (s.head_dim,)),
                (f"{b}.{stream}_attn_k_norm.weight", (s.head_dim,)),
            ]
            t += linear(f"{b}.{stream}_attn_proj", d, d)
            t += linear(f"{b}.{stream}_mlp.fc1", ff, d) + linear(f"{b}.{stream}_mlp.fc2", d, ff)
    return (
        t
        + linear("final_layer.linear", s.out_channels, d)
        + linear("final_layer.adaLN_modulation.1", 2 * d, d)
    )


def release_config(s: HunyuanVideo15Shape) -> dict:
    """config.json as the release writes it (``transformer/480p_t2v/config.json``)."""
    return {
        "_class_name": RELEASE_CLASS,
        "attn_mode": "flash",
        "attn_param": None,
        "concat_condition": True,
        "glyph_byT5_v2": True,
        "guidance_embed": False,
        "heads_num": s.heads,
        "hidden_size": s.hidden_size,
        "ideal_resolution": s.resolution,
        "ideal_task": s.task,
        "in_channels": s.out_channels,  # the latent's; the model's input adds the image latent and a mask
        "is_reshape_temporal_channels": False,
        "mlp_act_type": "gelu_tanh",
        "mlp_width_ratio": s.mlp_ratio,
        "mm_double_blocks_depth": s.num_layers,
        "mm_single_blocks_depth": 0,
        "out_channels": s.out_channels,
        "patch_size": [1, 1, 1],
        "qk_norm": True,
        "qk_norm_type": "rms",
        "qkv_bias": True,
        "rope_dim_list": list(s.rope_axes),
        "rope_theta": 256,
        "text_pool_type": None,
        "text_projection": "single_refiner",
        "text_states_dim": s.text_dim,
        "text_states_dim_2": None,
        "use_attention_mask": True,
        "use_cond_type_embedding": True,
        "use_meanflow": False,
        "vision_projection": "linear",
        "vision_states_dim": s.vision_dim,
    }


#: example layouts: ``release`` one variant folder of the release; ``diffusers`` diffusers' ``transformer/``


class HunyuanVideo15Examples(Examples):
    family = HUNYUANVIDEO15
    presets = {
        "tiny": HunyuanVideo15Shape(hidden_size=128, num_layers=2),
        # every Linear of the blocks a multiple of 256 wide (GGML's K-quants)
        "small": HunyuanVideo15Shape(hidden_size=256, num_layers=4),
        # the release: 2048 wide, 16 heads, 54 double blocks (8.3B)
        "8.3b": HunyuanVideo15Shape(hidden_size=2048, num_layers=54),
    }
    layouts = ("release", "diffusers")

    def models(self, preset: str, layout: str) -> list[ExampleModel]:
        """``release``: one variant folder of the release (original names, q/k/v apart, its config.json);
        ``diffusers``: ``transformer/`` with the names and shapes diffusers' own class has (built on meta)."""
        shape: HunyuanVideo15Shape = self.shape(preset, layout)
        if layout == "release":
            return [ExampleModel(".", release_tensors(shape), release_config(shape))]
        return [diffusers_example(self.family, release_tensors(shape), release_config(shape))]


HUNYUANVIDEO15_EXAMPLES = HunyuanVideo15Examples()
