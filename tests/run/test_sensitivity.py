"""`quantize sensitivity`, and the streamed forward pass it shares with `verify --forward`.

The source is a diffusers Wan (dim 256, two blocks) with a planted layer: one large outlier in every row of
`blocks.1.attn1.to_q`, which block-wise and row-wise quantizers (GGUF, int8, NF4) cannot hold without losing
the rest of the row. It must be ranked first, raised by a proposal while most layers stay at the recipe's
type, and the proposed recipe's checkpoint must pass `verify --forward` at the target. The figures are checked
against oracles outside the streamed model: diffusers' own model run whole, and each layer's X·Q(W) computed
from an ordinary forward hook and the format's encode/decode.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from quantize.models import get_family
from quantize.plan import make_plan
from quantize.recipes import load_recipe, parse_recipe
from quantize.run.forward import (
    StreamedModel,
    load_inputs,
    runnable,
    source_weights,
    stored_weights,
)
from quantize.run.sensitivity import files_size, measure, planned_weights
from tests.conftest import run_cli, run_process

PLANTED = "blocks.1.attn1.to_q"
GGUF = "wan-diffusers-gguf-q4_k_m.yaml"


def _planted_wan(path: Path) -> Path:
    from tests.diffusers_models import wan_of_width

    wan_of_width(path / "transformer", width=256)
    file = path / "transformer" / "diffusion_pytorch_model.safetensors"
    tensors = load_file(file)
    w = tensors[f"{PLANTED}.weight"].float()
    cols = torch.randint(0, w.shape[1], (w.shape[0],), generator=torch.Generator().manual_seed(1))
    w[torch.arange(w.shape[0]), cols] = 30 * w.abs().max()
    tensors[f"{PLANTED}.weight"] = w.to(torch.bfloat16)
    save_file(tensors, file, metadata={"format": "pt"})
    return path


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> Path:
    return _planted_wan(tmp_path_factory.mktemp("sensitivity") / "Wan-planted")


def _json(*args) -> dict:
    proc = run_cli("sensitivity", *args, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def report(planted):
    """report(recipe): `sensitivity planted -r RECIPE --json`, measured once per module (several tests start
    from the same one); each call returns a copy of its own."""
    made: dict[str, dict] = {}

    def get(recipe) -> dict:
        if str(recipe) not in made:
            made[str(recipe)] = _json(planted, "-r", recipe)
        return copy.deepcopy(made[str(recipe)])

    return get


COMFY_INT8 = "format: comfy_int8\ncomponents: [transformer]\ntargets: ['blocks\\.\\d+\\.(attn[12]\\.\\w+|ffn\\.net\\.0\\.proj)']\nignore: ['blocks\\.\\d+\\.attn[12]\\.norm_\\w+']\n"


@pytest.mark.parametrize("recipe", [GGUF, "wan-diffusers-nf4.yaml", "comfy_int8"])
def test_the_planted_layer_is_ranked_first(planted, report, tmp_path, recipe):
    if recipe == "comfy_int8":
        recipe = tmp_path / "int8.yaml"
        recipe.write_text(COMFY_INT8)
    measured = report(recipe)
    layers = measured["layers"]
    assert layers[0]["module"] == PLANTED, layers[:3]
    assert set(layers[0]) == {"module", "component", "type", "output_sqnr_db", "weight_sqnr_db", "bytes"}
    figures = [lay["output_sqnr_db"] for lay in layers]
    assert figures == sorted(figures)
    # a clear margin: the planted layer is worse than the next by more than the spread of the rest
    assert figures[1] - figures[0] > 3
    plan = make_plan(planted, load_recipe(recipe).recipe)
    (cp,) = plan.components
    by_module = {tp.module: tp for tp in cp.quantized()}
    assert {lay["module"] for lay in layers} == set(by_module)
    assert all(lay["bytes"] == by_module[lay["module"]].output_bytes for lay in layers)
    assert all(lay["component"] == "transformer" for lay in layers)
    # the checkpoint's files on disk, headers and padding included: more than its tensors' bytes
    assert measured["bytes"] == files_size(plan) > plan.output_bytes
    assert 10 < measured["forward_sqnr_db"] < 80


@pytest.mark.slow
def test_output_sqnr_is_x_times_q_of_w_from_an_ordinary_forward(planted):
    """Each layer's figure at every rung (Q4_K, Q5_K, Q6_K, Q8_0, kept), against X captured by a plain forward
    hook on diffusers' own model (run whole) and Q(W) from the format's encode and decode, and its weight SQNR:
    the streamed pass measures what it says."""
    import diffusers

    from quantize.formats import get_format

    plan = make_plan(planted, load_recipe(GGUF).recipe)
    measured = measure(plan, all_rungs=True)
    model = diffusers.WanTransformer3DModel.from_pretrained(planted / "transformer").float().eval()
    fmt = get_format("gguf")
    (cp,) = plan.components
    plans = {tp.module: tp for tp in cp.quantized()}
    seen: dict[str, torch.Tensor] = {}
    for name, m in model.named_modules():
        if name in plans:
            m.register_forward_pre_hook(lambda m, args, name=name: seen.__setitem__(name, args[0]))
    run = runnable(cp)
    with torch.no_grad():
        model(**run.family.inputs.call(run.config, load_inputs(None, run.family, run.config)))
    ladders = set()
    for layer in measured.layers:
        tp = plans[layer.module]
        w = tp.source.read().float()
        x = seen[layer.module].reshape(-1, w.shape[1])
        ladders.add(tuple(r.label(fmt) for r in layer.rungs))
        for level, rung in enumerate(layer.rungs):
            if rung.keep:  # kept as stored (bf16 source): exact
                assert layer.noise[level] == 0 and layer.weight_sqnr[level] is None
                assert layer.output_sqnr_db(level) == math.inf
                continue
            q = fmt.decode(fmt.encode(w, rung.options), torch.float32, options=rung.options)
            signal, noise = (x @ w.T).double().pow(2).sum(), (x @ (w - q).T).double().pow(2).sum()
            want = 10 * math.log10(float(signal) / float(noise))
            assert layer.output_sqnr_db(level) == pytest.approx(want, abs=0.01), (layer.module, rung)
            weight = 10 * math.log10(float(w.double().pow(2).sum()) / float((w - q).double().pow(2).sum()))
            assert layer.weight_sqnr[level] == pytest.approx(weight, abs=0.01), (layer.module, rung)
    # the recipe's Q4_K layers and its Q6_K ones (ffn.2, attn v) each climb their own ladder
    assert ladders == {("Q4_K", "Q5_K", "Q6_K", "Q8_0", "kept"), ("Q6_K", "Q8_0", "kept")}


def test_a_targeted_linear_the_model_never_calls_is_named(planted, monkeypatch):
    import quantize.run.sensitivity
    from quantize.errors import InputError

    real = quantize.run.sensitivity._capture

    def capture(layer, fmt, pool):  # as if the model never called blocks.0.attn1.to_k
        hook = real(layer, fmt, pool)
        return (lambda module, x: None) if layer.module == "blocks.0.attn1.to_k" else hook

    monkeypatch.setattr(quantize.run.sensitivity, "_capture", capture)
    with pytest.raises(InputError, match=r"never called the targeted Linear 'blocks\.0\.attn1\.to_k'"):
        measure(make_plan(planted, load_recipe(GGUF).recipe))


def test_the_streamed_pass_is_the_models_forward_holding_one_layer_at_a_time(planted):
    import diffusers

    plan = make_plan(planted, load_recipe(GGUF).recipe)
    (cp,) = plan.components
    run = runnable(cp)
    streamed = StreamedModel(run)
    x = load_inputs(None, run.family, run.config)
    held = []

    def count(module, args, out):  # after the Linear ran, before the pass empties it
        held.append(sum(p.numel() for p in streamed.model.parameters() if not p.is_meta))

    hooks = [
        m.register_forward_hook(count) for m in streamed.model.modules() if isinstance(m, torch.nn.Linear)
    ]
    got = streamed.forward(x, source_weights(run))
    for h in hooks:
        h.remove()
    model = diffusers.WanTransformer3DModel.from_pretrained(planted / "transformer").float().eval()
    with torch.no_grad():
        want = model(**run.inputs.call(run.config, x))[0]
    assert torch.equal(got, want)
    # while a Linear runs: the root's own tensors, and the layers on the way to it (a block's modulation
    # table, the norm before it, the Linear itself), never a whole block
    root = sum(p.numel() for p in streamed.model.parameters(recurse=False))
    block = sum(p.numel() for p in model.blocks[0].parameters())
    largest = max(sum(p.numel() for p in unit.parameters(recurse=False)) for _, unit in streamed.units)
    assert len(held) == sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert root + largest <= max(held) < root + block / 2
    assert all(p.is_meta for p in streamed.model.parameters())  # all given back


def test_original_names_run_as_the_diffusers_class(planted, tmp_path):
    """A native-named copy of the source (renamed through the name table, with an original Wan config) runs as
    WanTransformer3DModel and gives the very same output."""
    native = tmp_path / "Wan-native"
    native.mkdir()
    tensors = load_file(planted / "transformer" / "diffusion_pytorch_model.safetensors")
    save_file({get_family("wan").native_name(k): v for k, v in tensors.items()}, native / "model.safetensors")
    config = json.loads((planted / "transformer" / "config.json").read_text())
    dim = config["num_attention_heads"] * config["attention_head_dim"]
    (native / "config.json").write_text(
        json.dumps(
            {
                "_class_name": "WanModel",
                "model_type": "t2v",
                "dim": dim,
                "eps": 1e-06,
                "ffn_dim": config["ffn_dim"],
                "freq_dim": config["freq_dim"],
                "in_dim": config["in_channels"],
                "num_heads": config["num_attention_heads"],
                "num_layers": config["num_layers"],
                "out_dim": config["out_channels"],
                "text_len": 512,
            }
        )
    )
    outputs = []
    for src, recipe in ((planted, GGUF), (native, "wan-gguf-q4_k_m.yaml")):
        (cp,) = make_plan(src, load_recipe(recipe).recipe).components
        run = runnable(cp)
        outputs.append(
            StreamedModel(run).forward(load_inputs(None, run.family, run.config), source_weights(run))
        )
    assert torch.equal(*outputs)


@pytest.mark.parametrize("recipe", [GGUF, "wan-diffusers-comfy-fp8.yaml", "wan-diffusers-nf4.yaml"])
def test_the_recipes_figure_is_what_verify_decodes_from_the_converted_files(
    planted, tmp_path, recipe, monkeypatch
):
    """`planted_weights` (what sensitivity runs for the recipe), its row chunks encoded here or on threads a
    few ahead, equals the converted checkpoint decoded."""
    from concurrent.futures import ThreadPoolExecutor

    import quantize.encode
    from quantize.containers import get_container
    from quantize.formats import format_info

    out = tmp_path / "out"
    run_cli("convert", planted, out, "-r", recipe, check=True)
    plan = make_plan(planted, load_recipe(recipe).recipe)
    (cp,) = plan.components
    run = runnable(cp)
    stored = get_container(format_info(plan.format.NAME).container).open_stored(out, cp.rel)
    decoded = stored_weights(run, stored, plan.format)
    monkeypatch.setattr(quantize.encode, "CHUNK_BYTES", 64 << 10)  # many chunks a weight, 3 in flight
    with ThreadPoolExecutor(2) as executor:
        pool = quantize.encode.ChunkPool(executor, ahead=3)
        here, threaded = planned_weights(run, plan.format), planned_weights(run, plan.format, pool=pool)
        for name in run.plans:
            want = decoded(name)
            assert torch.equal(here(name), want) and torch.equal(threaded(name), want), name


@pytest.mark.slow
def test_a_proposal_reaches_the_target_and_verify_proves_it(planted, report, tmp_path):
    base = report(GGUF)["forward_sqnr_db"]
    target = round(base + 0.5, 2)
    written = tmp_path / "proposed.yaml"
    proposed = _json(planted, "-r", GGUF, "--min-forward-sqnr", target, "--write-recipe", written)
    proposal = proposed["proposal"]
    assert proposal["reached"] and proposal["forward_sqnr_db"] >= target
    raised = {r["module"]: r["type"] for r in proposal["raised"]}
    assert PLANTED in raised
    assert 0 < len(raised) < len(proposed["layers"]) / 2  # most layers stay at the recipe's types
    assert proposal["bytes"] > proposal["recipe_bytes"]
    # an ordinary recipe: the raised modules as explicit types ahead of the recipe's own, the target as a check
    recipe = parse_recipe(written.read_text())
    assert recipe.checks.min_forward_sqnr_db == target
    assert list(recipe.types)[: len(raised)] == [m.replace(".", "\\.") for m in raised]
    assert recipe.type == "Q4_K" and recipe.ignore == []
    out = tmp_path / "out"
    run_cli("convert", planted, out, "-r", written, check=True)
    assert sum(f.stat().st_size for f in out.rglob("*.gguf")) >= proposal["bytes"]
    (cp,) = make_plan(planted, recipe).components
    assert {tp.module: tp.qtype for tp in cp.quantized() if tp.module in raised} == raised
    proc = run_cli("verify", out, "--source", planted, "--forward", "--json")
    assert proc.returncode == 0, proc.stdout
    # the very figure the proposal measured: its passes decode what convert stores
    figure = json.loads(proc.stdout)["forward"]["transformer"]
    assert figure == {
        "model": "WanTransformer3DModel",
        "output_sqnr_db": proposal["forward_sqnr_db"],
        "min_forward_sqnr_db": target,
    }
    text = run_cli("verify", out, "--source", planted, "--forward").stdout
    assert f"WanTransformer3DModel output SQNR {proposal['forward_sqnr_db']:.2f} dB" in text
    # and the same checkpoint held to a figure above the one it reached fails
    strict = tmp_path / "strict.yaml"
    strict.write_text(
        written.read_text().replace(f"min_forward_sqnr_db: {target}", "min_forward_sqnr_db: 200")
    )
    out2 = tmp_path / "out2"
    run_cli("convert", planted, out2, "-r", strict, check=True)
    assert run_cli("verify", out2, "--source", planted, "--forward").returncode == 1


COMFY_NVFP4 = (
    "format: comfy_nvfp4\ncomponents: [transformer]\n"
    "targets: ['blocks\\.\\d+\\.(attn[12]\\.(to_q|to_k|to_v|to_out\\.0)|ffn\\.net\\.(0\\.proj|2))']\n"
)


def test_an_nvfp4_recipe_is_raised_to_a_mixed_file_of_mxfp8_layers(planted, tmp_path):
    """NVFP4's ladder: nvfp4 -> mxfp8 -> kept. The proposal is one ComfyUI file mixing layouts, which verify proves."""
    recipe = tmp_path / "nvfp4.yaml"
    recipe.write_text(COMFY_NVFP4)
    base = _json(planted, "-r", recipe)
    assert {layer["type"] for layer in base["layers"]} == {"nvfp4"}
    target = round(base["forward_sqnr_db"] + 2, 2)
    written = tmp_path / "proposed.yaml"
    proposal = _json(planted, "-r", recipe, "--min-forward-sqnr", target, "--write-recipe", written)[
        "proposal"
    ]
    raised = {r["module"]: r["type"] for r in proposal["raised"]}
    # the planted outliers (one a row) sit each in its own block of 16, which its E4M3 scale absorbs: in NVFP4 the
    # most sensitive layer is another one, and it goes first
    worst = min(base["layers"], key=lambda layer: layer["output_sqnr_db"])["module"]
    assert proposal["reached"] and proposal["raised"][0]["module"] == worst
    assert set(raised.values()) <= {"mxfp8", "kept"} and len(raised) < len(base["layers"]) / 2
    out = tmp_path / "out"
    run_cli("convert", planted, out, "-r", written, check=True)
    (path,) = out.rglob("*.safetensors")
    with safe_open(path, "pt") as f:
        markers = [
            json.loads(f.get_tensor(k).numpy().tobytes()) for k in f.keys() if k.endswith("comfy_quant")
        ]
    layouts = {m["format"] for m in markers}
    assert "nvfp4" in layouts and ("mxfp8" in layouts or "kept" in raised.values())
    proc = run_cli("verify", out, "--source", planted, "--forward", "--json")
    assert proc.returncode == 0, proc.stdout
    assert json.loads(proc.stdout)["forward"]["transformer"]["output_sqnr_db"] == proposal["forward_sqnr_db"]


W4A8 = "wan-diffusers-comfy-w4a8"


def test_a_w4a8_recipe_within_a_size_budget_is_one_comfyui_file_mixing_w4a8_and_int8(planted, tmp_path):
    """W4A8's ladder: asym_w4a8_int8 -> int8_convrot (refitted to the layer's ConvRot group) -> kept. Within a
    budget the proposal is one ComfyUI file, most layers W4A8 and the raised ones int8, which verify proves."""
    base_bytes = files_size(make_plan(planted, load_recipe(W4A8).recipe))
    budget = base_bytes + 200_000
    written = tmp_path / "fits.yaml"
    proposed = _json(planted, "-r", W4A8, "--max-size", budget, "--write-recipe", written)
    proposal = proposed["proposal"]
    assert proposed["bytes"] == proposal["recipe_bytes"] == base_bytes
    assert proposal["reached"] and base_bytes < proposal["bytes"] <= budget
    assert proposal["forward_sqnr_db"] > proposed["forward_sqnr_db"]
    raised = {r["module"]: r["type"] for r in proposal["raised"]}
    assert set(raised.values()) == {"int8_convrot"} and 0 < len(raised) < len(proposed["layers"]) / 2
    recipe = parse_recipe(written.read_text())
    assert recipe.format == "comfy_w4a8" and set(recipe.types.values()) == {"int8_convrot"}
    out = tmp_path / "out"
    run_cli("convert", planted, out, "-r", written, check=True)
    (path,) = out.rglob("*.safetensors")
    assert path.stat().st_size == proposal["bytes"]
    with safe_open(path, "pt") as f:
        markers = {
            k.removesuffix(".comfy_quant"): json.loads(f.get_tensor(k).numpy().tobytes())
            for k in f.keys()
            if k.endswith("comfy_quant")
        }
    assert len(markers) == len(proposed["layers"])
    int8 = {k for k, m in markers.items() if m["format"] == "int8_tensorwise"}
    assert len(int8) == len(raised)
    assert all(
        markers[k] == {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 256} for k in int8
    )
    assert {m["format"] for k, m in markers.items() if k not in int8} == {"asym_w4a8_int8"}
    proc = run_cli("verify", out, "--source", planted, "--forward", "--json")
    assert proc.returncode == 0, proc.stdout
    assert json.loads(proc.stdout)["forward"]["transformer"]["output_sqnr_db"] == proposal["forward_sqnr_db"]


def test_the_4bit_int_layouts_are_raised_to_int8_convrot_fitted_to_the_layer(planted):
    """W4A8 and W4A4 -> int8 ConvRot -> kept; the raised layer is replanned through `Format.fitted`: its ConvRot
    group is the one its width takes (the rung itself names none)."""
    from quantize.formats import get_format
    from quantize.formats.options import ComfyOptions
    from quantize.plan import replanned
    from quantize.run.sensitivity import ladder

    for fmt, layout in (("comfy_w4a8", "asym_w4a8_int8"), ("comfy_w4a4", "convrot_w4a4")):
        rungs = ladder(get_format(fmt), ComfyOptions(layout, convrot_group=64))
        assert [r.label(get_format(fmt)) for r in rungs] == [layout, "int8_convrot", "kept"]
        assert rungs[1].options == ComfyOptions("int8_convrot")
    plan = make_plan(planted, load_recipe(W4A8).recipe)
    tp = next(t for t in plan.components[0].tensors if t.module == PLANTED)
    assert tp.options == ComfyOptions("asym_w4a8_int8", convrot_group=256)
    up = replanned(tp, plan.format, plan.recipe.keep_dtype, ComfyOptions("int8_convrot"))
    assert up.options == ComfyOptions("int8_convrot", convrot_group=256) and up.qtype == "int8_convrot"
    assert up.output_name == tp.output_name and up.output_bytes > tp.output_bytes


def test_a_format_with_one_encoding_raises_to_kept(planted, report, tmp_path):
    written = tmp_path / "nf4.yaml"
    target = round(report("wan-diffusers-nf4.yaml")["forward_sqnr_db"] + 3, 2)
    proposed = _json(
        planted, "-r", "wan-diffusers-nf4.yaml", "--min-forward-sqnr", target, "--write-recipe", written
    )
    proposal = proposed["proposal"]
    raised = proposal["raised"]
    assert raised and all(r["type"] == "kept" for r in raised) and raised[0]["module"] == PLANTED
    assert len(raised) < len(proposed["layers"]) / 2
    recipe = parse_recipe(written.read_text())
    assert PLANTED.replace(".", "\\.") in recipe.ignore
    out = tmp_path / "out"
    run_cli("convert", planted, out, "-r", written, check=True)
    proc = run_cli("verify", out, "--source", planted, "--forward", "--json")
    assert proc.returncode == 0, proc.stdout
    assert json.loads(proc.stdout)["forward"]["transformer"]["output_sqnr_db"] == proposal["forward_sqnr_db"]


def test_an_unreachable_target_exits_1_and_writes_nothing(planted, tmp_path):
    written = tmp_path / "never.yaml"
    proc = run_cli("sensitivity", planted, "-r", GGUF, "--min-forward-sqnr", 500, "--write-recipe", written)
    assert proc.returncode == 1, proc.stderr
    assert "not reached" in proc.stdout and not written.exists()
    # the same as JSON, over a recipe file that stays as it was
    written.write_text("keep me")
    proc = run_cli(
        "sensitivity", planted, "-r", GGUF, "--min-forward-sqnr", 500, "--write-recipe", written,
        "--overwrite", "--json",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    proposal = json.loads(proc.stdout)["proposal"]
    assert not proposal["reached"] and proposal["recipe_file"] is None and written.read_text() == "keep me"
    assert proposal["passes"] >= 1 and proposal["forward_sqnr_db"] < 500


def test_a_size_budget(planted, report, tmp_path):
    base = report(GGUF)
    budget = base["bytes"] + 120_000
    written = tmp_path / "budget.yaml"
    proposal = _json(planted, "-r", GGUF, "--max-size", budget, "--write-recipe", written)["proposal"]
    assert proposal["reached"] and base["bytes"] < proposal["bytes"] <= budget
    assert proposal["forward_sqnr_db"] > base["forward_sqnr_db"]
    assert PLANTED in {r["module"] for r in proposal["raised"]}
    recipe = parse_recipe(written.read_text())
    # the budget is the files' size on disk (headers and padding included), not their tensors' bytes
    assert make_plan(planted, recipe).output_bytes < proposal["bytes"]
    out = tmp_path / "out"
    run_cli("convert", planted, out, "-r", written, check=True)
    assert sum(p.stat().st_size for p in out.rglob("*.gguf")) == proposal["bytes"] <= budget
    assert recipe.checks.min_forward_sqnr_db == math.floor(proposal["forward_sqnr_db"] * 10) / 10
    proc = run_cli("sensitivity", planted, "-r", GGUF, "--max-size", base["bytes"] - 1)
    assert proc.returncode == 1 and "does not fit --max-size" in proc.stdout


@pytest.mark.slow
def test_the_table(planted):
    # a process of its own: whether the imports of a forward pass stay quiet depends on what was imported before
    proc = run_process("sensitivity", planted, "-r", GGUF, "--top", 3)
    assert proc.returncode == 0, proc.stderr
    (cp,) = make_plan(planted, load_recipe(GGUF).recipe).components
    quantized = len(list(cp.quantized()))
    assert proc.stdout.index(PLANTED) < proc.stdout.index(f"... and {quantized - 3} more")
    assert "forward SQNR of the recipe in transformer" in proc.stdout
    # what importing diffusers pulls in stays quiet (torchao's CUDA libraries, bitsandbytes' kernels)
    assert proc.stderr.splitlines() == [
        f"pass: transformer: the source model, and each of its {quantized} quantized Linears",
        "pass: transformer: the recipe's model",
    ]


# --- inputs captured from a pipeline ---------------------------------------------------------------


def capture_inputs(pipe, path: Path, **call) -> None:
    """docs/sensitivity.md's recipe: keep the transformer's first call's inputs, then save them (what --inputs reads)."""
    keys = ("hidden_states", "timestep", "encoder_hidden_states", "encoder_hidden_states_image")
    captured: dict[str, torch.Tensor] = {}

    def keep_first(module, args, kwargs):
        if not captured:
            captured.update(
                {
                    k: v.detach().cpu().contiguous()
                    for k, v in kwargs.items()
                    if k in keys and torch.is_tensor(v)
                }
            )

    handle = pipe.transformer.register_forward_pre_hook(keep_first, with_kwargs=True)
    pipe(**call)
    handle.remove()
    save_file(captured, str(path))


def test_inputs_captured_from_a_pipeline(tmp_path):
    from diffusers import WanPipeline

    from tests.diffusers_models import NO_TEXT, wan_pipeline

    src = wan_pipeline(tmp_path / "Wan-pipeline")
    pipe = WanPipeline.from_pretrained(src, torch_dtype=torch.bfloat16, **NO_TEXT)
    embeds = torch.randn(1, 8, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    inputs = tmp_path / "inputs.safetensors"
    capture_inputs(
        pipe,
        inputs,
        prompt_embeds=embeds,
        negative_prompt_embeds=torch.zeros_like(embeds),
        height=32,
        width=32,
        num_frames=5,
        num_inference_steps=2,
        guidance_scale=1.0,
        output_type="latent",
    )
    assert set(load_file(inputs)) == {"hidden_states", "timestep", "encoder_hidden_states"}
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "format: fp8_channel\ncomponents: [transformer]\ntargets: ['blocks\\.\\d+\\.ffn\\.net\\.0\\.proj']\n"
    )
    captured = _json(src, "-r", recipe, "--inputs", inputs)
    random = _json(src, "-r", recipe)
    assert captured["forward_sqnr_db"] != random["forward_sqnr_db"]
    out = tmp_path / "out"
    run_cli("convert", src, out, "-r", recipe, check=True)
    assert run_cli("verify", out, "--source", src, "--forward", "--inputs", inputs).returncode == 0
    # a tensor the model does not take is named
    bad = tmp_path / "bad.safetensors"
    save_file({**load_file(inputs), "latents": torch.zeros(1)}, str(bad))
    proc = run_cli("sensitivity", src, "-r", recipe, "--inputs", bad)
    assert proc.returncode == 2 and "'latents' is not an input of this model" in proc.stderr
    proc = run_cli("verify", out, "--source", src, "--forward", "--inputs", bad)
    assert proc.returncode == 2 and "'latents'" in proc.stderr
    save_file({"hidden_states": torch.zeros(1, 16, 2, 8, 8)}, str(bad))
    proc = run_cli("sensitivity", src, "-r", recipe, "--inputs", bad)
    assert proc.returncode == 2 and "no tensor 'timestep'" in proc.stderr
    # a tensor of the wrong rank or width is named, with its shape and the shape the model takes
    good = load_file(inputs)
    for key, wrong in (
        ("hidden_states", good["hidden_states"][0]),
        ("encoder_hidden_states", torch.zeros(1, 8, 3)),
    ):
        save_file({**good, key: wrong}, str(bad))
        proc = run_cli("sensitivity", src, "-r", recipe, "--inputs", bad)
        assert proc.returncode == 2, proc.stderr
        assert f"tensor {key!r} has shape {list(wrong.shape)}" in proc.stderr and "takes" in proc.stderr
        assert "not enough values" not in proc.stderr


def test_kandinsky5(tmp_path):
    from tests.diffusers_models import kandinsky5

    src = tmp_path / "K5"
    kandinsky5(src / "transformer")
    # diffusers initializes the output layer to zeros (every output 0, whatever the weights): give it values
    (file,) = (src / "transformer").glob("*.safetensors")
    tensors = load_file(file)
    g = torch.Generator().manual_seed(0)
    tensors = {
        k: torch.randn(v.shape, generator=g).to(v.dtype) / 8 if not v.any() else v for k, v in tensors.items()
    }
    save_file(tensors, file, metadata={"format": "pt"})
    # the streamed pass is diffusers' own model run whole, to the bit
    import diffusers

    (cp,) = make_plan(src, load_recipe("kandinsky5-torchao-fp8.yaml").recipe).components
    run = runnable(cp)
    x = load_inputs(None, run.family, run.config)
    model = diffusers.Kandinsky5Transformer3DModel.from_pretrained(src / "transformer").float().eval()
    with torch.no_grad():
        want = model(**run.inputs.call(run.config, x))  # with return_dict=False, the sample alone
    assert torch.equal(StreamedModel(run).forward(x, source_weights(run)), want)
    report = _json(src, "-r", "kandinsky5-torchao-fp8.yaml")
    assert report["layers"] and 20 < report["forward_sqnr_db"] < 80
    assert {lay["module"].split(".")[0] for lay in report["layers"]} >= {
        "text_transformer_blocks",
        "visual_transformer_blocks",
    }


def test_usage_errors(planted, tmp_path):
    proc = run_cli("sensitivity", planted, "-r", GGUF, "--write-recipe", tmp_path / "x.yaml")
    assert proc.returncode == 2 and "--min-forward-sqnr" in proc.stderr
    existing = tmp_path / "exists.yaml"
    existing.write_text("keep me")
    proc = run_cli("sensitivity", planted, "-r", GGUF, "--min-forward-sqnr", 30, "--write-recipe", existing)
    assert proc.returncode == 2 and "--overwrite" in proc.stderr and existing.read_text() == "keep me"
    for target in ("nan", "inf"):
        proc = run_cli("sensitivity", planted, "-r", GGUF, "--min-forward-sqnr", target)
        assert proc.returncode == 2 and "give a finite figure" in proc.stderr
    proc = run_cli(
        "sensitivity",
        planted,
        "-r",
        GGUF,
        "--min-forward-sqnr",
        30,
        "--write-recipe",
        tmp_path / "no" / "r.yaml",
    )
    assert proc.returncode == 2 and "its folder does not exist" in proc.stderr
    both = run_cli("sensitivity", planted, "-r", GGUF, "--min-forward-sqnr", 30, "--max-size", "1GB")
    assert both.returncode == 2 and "not both" in both.stderr


def test_two_experts_are_measured_and_raised_together(make_wan, tmp_path):
    """A14B: each expert measured on its own (the figure is the worse one's); a raise names a module, so it
    raises it in both experts, and verify --forward proves the target in each."""
    src = make_wan("a14b")
    recipe = "wan2.2-a14b-gguf-q8_0.yaml"
    report = _json(src, "-r", recipe)
    experts = {"high_noise_model", "low_noise_model"}
    assert {lay["component"] for lay in report["layers"]} == experts == set(report["components"])
    assert report["forward_sqnr_db"] == min(c["forward_sqnr_db"] for c in report["components"].values())
    target = round(report["forward_sqnr_db"] + 0.5, 2)
    written = tmp_path / "a14b.yaml"
    proposal = _json(src, "-r", recipe, "--min-forward-sqnr", target, "--write-recipe", written)["proposal"]
    assert proposal["reached"] and proposal["forward_sqnr_db"] >= target
    raised = {r["module"]: r["type"] for r in proposal["raised"]}
    plan = make_plan(src, parse_recipe(written.read_text()))
    for cp in plan.components:
        got = {tp.module: tp.qtype if tp.quantize else "kept" for tp in cp.tensors if tp.module in raised}
        assert got == raised, cp.rel
    out = tmp_path / "out"
    run_cli("convert", src, out, "-r", written, check=True)
    proc = run_cli("verify", out, "--source", src, "--forward", "--json")
    assert proc.returncode == 0, proc.stdout
    figures = json.loads(proc.stdout)["forward"]
    assert set(figures) == experts and all(f["output_sqnr_db"] >= target for f in figures.values())
    assert min(f["output_sqnr_db"] for f in figures.values()) == proposal["forward_sqnr_db"]


def test_a_lora_is_measured_merged(make_wan, tmp_path):
    """With --lora, the source measured is the merged one: the same figures as the merged model saved."""
    from tests.helpers.lora import make_lora, merged_source, write_lora

    src = make_wan("t2v")
    lora = make_lora(src, seed=3)
    path = write_lora(lora, tmp_path / "style.safetensors")
    merged = merged_source(src, tmp_path / "merged", [lora])
    with_lora = _json(src, "-r", "wan-fp8.yaml", "--lora", path)
    assert with_lora == _json(merged, "-r", "wan-fp8.yaml")
    assert with_lora["layers"] != _json(src, "-r", "wan-fp8.yaml")["layers"]


def test_with_format_and_json_stdout_is_the_json_and_the_recipe_chosen_is_said_on_stderr(planted):
    proc = run_cli("sensitivity", planted, "--format", "comfy_fp8", "--json", "--top", "1")
    assert proc.returncode == 0, proc.stderr
    chosen = json.loads(proc.stdout)["recipe"]  # nothing but the JSON on stdout
    assert f"recipe {chosen}: " in proc.stderr and chosen.startswith("wan-diffusers-")
