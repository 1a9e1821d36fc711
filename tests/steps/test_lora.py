"""LoRAs merged before quantizing: `convert --lora` gives byte for byte what converting the merged model gives.

The oracle here merges with plain torch on the source's own tensor names (W.float() + Σ strength·(alpha/rank)·
up@down + Σ strength·diff, cast once), saves the merged model with safetensors, and converts it without any
LoRA; the LoRA files are written in each naming convention met in the wild from the same tensors. Names in
diffusers' scheme come from diffusers' own converter. PEFT (diffusers' `load_lora_adapter` + `fuse_lora`)
is a second oracle for a diffusers-named LoRA.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from quantize.check.verify import verify
from quantize.errors import InputError
from quantize.plan import make_plan
from quantize.publish.converter import convert
from quantize.read.checkpoint import open_component
from quantize.recipes import load_recipe
from quantize.steps.lora import LoraMerge, LoraSpec, open_lora, open_loras
from quantize.steps.lora_record import LoraRecord
from tests.conftest import read_json, run_cli
from tests.diffusers_models import wan as diffusers_wan
from tests.helpers.lora import CONVENTIONS, RANK, make_lora, merged_source, write_lora


def recorded_loras(manifest) -> list:
    """The LoRAs a manifest's one step record holds."""
    (record,) = manifest.steps
    return LoraRecord.model_validate(record).loras


def to_diffusers_name(native: str) -> str:
    """diffusers' own converter, one name at a time (the oracle for the name table)."""
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    (name,) = convert_wan_transformer_to_diffusers({native: torch.zeros(1)})
    return name


def to_native_name(diffusers: str) -> str:
    """The inverse of `to_diffusers_name`, found by search over the converter's answers."""
    from quantize.models import get_family

    native = get_family("wan").native_name(diffusers)
    assert to_diffusers_name(native) == diffusers
    return native


def model_files(out: Path) -> dict[str, bytes]:
    """Every output file but the manifest and the card (which record the LoRAs)."""
    skip = {"quantize_manifest.json", "README.md"}
    return {
        p.relative_to(out).as_posix(): p.read_bytes()
        for p in sorted(out.rglob("*"))
        if p.is_file() and p.name not in skip
    }


def assert_same_output(a: Path, b: Path) -> None:
    fa, fb = model_files(a), model_files(b)
    assert sorted(fa) == sorted(fb)
    for name in fa:
        assert fa[name] == fb[name], f"{name} differs"


# --- the equality, on every convention --------------------------------------------------------


@pytest.mark.parametrize("convention", list(CONVENTIONS))
def test_every_convention_gives_what_converting_the_merged_model_gives(convention, wan_tiny, tmp_path):
    kohya = convention.startswith("kohya")
    alpha = torch.tensor(2, dtype=torch.int64) if kohya else torch.tensor(8.0).bfloat16()
    lora = make_lora(wan_tiny, seed=1, alpha=alpha if convention != "none" else None)
    lora.strength = 0.75
    path = write_lora(lora, tmp_path / "style.safetensors", convention)
    manifest = convert(wan_tiny, tmp_path / "out", "wan-fp8", steps=[open_loras([f"{path}:0.75"])], workers=2)
    convert(merged_source(wan_tiny, tmp_path / "merged", [lora]), tmp_path / "direct", "wan-fp8", workers=2)
    assert_same_output(tmp_path / "out", tmp_path / "direct")
    (entry,) = recorded_loras(manifest)
    assert entry.tensors == {".": len(lora.terms)} and entry.strength == 0.75 and entry.ignored == {}
    if convention == "diffusion_model":  # once: the LoRA changed something, and a plain manifest is as it was
        plain = convert(wan_tiny, tmp_path / "plain", "wan-fp8", workers=2)
        assert plain.output_files != manifest.output_files
        assert {"steps", "loras"}.isdisjoint(read_json(tmp_path / "plain" / "quantize_manifest.json"))


def test_a_diffusers_named_lora_merges_into_original_names(wan_tiny, tmp_path):
    lora = make_lora(wan_tiny, seed=2)
    del lora.terms["head.modulation"]  # its diffusers name is a root tensor: no LoRA key spells it
    path = write_lora(lora, tmp_path / "d.safetensors", "transformer", rename=to_diffusers_name)
    assert any(".attn1.to_q." in k for k in load_file(path)), "the LoRA is in diffusers' names"
    convert(wan_tiny, tmp_path / "out", "wan-fp8", steps=[open_loras([path])], workers=2)
    convert(merged_source(wan_tiny, tmp_path / "merged", [lora]), tmp_path / "direct", "wan-fp8", workers=2)
    assert_same_output(tmp_path / "out", tmp_path / "direct")


def test_an_original_named_lora_merges_into_diffusers_names(tmp_path):
    src = diffusers_wan(tmp_path / "src" / "transformer").parent
    lora = make_lora(src, seed=3, rel="transformer")
    assert "blocks.1.scale_shift_table" in lora.terms  # diff_m reaches diffusers' modulation
    path = write_lora(lora, tmp_path / "n.safetensors", "diffusion_model", rename=to_native_name)
    assert "diffusion_model.blocks.1.diff_m" in load_file(
        path
    ) and "diffusion_model.head.diff_m" in load_file(path)
    convert(src, tmp_path / "out", "wan-diffusers-fp8", steps=[open_loras([path])], workers=2)
    convert(
        merged_source(src, tmp_path / "merged", [lora], rel="transformer"),
        tmp_path / "direct",
        "wan-diffusers-fp8",
        workers=2,
    )
    assert_same_output(tmp_path / "out", tmp_path / "direct")


def test_a_diffusers_named_lora_on_diffusers_names_reaches_the_modulation(tmp_path):
    src = diffusers_wan(tmp_path / "src" / "transformer").parent
    lora = make_lora(src, seed=16, rel="transformer")
    del lora.terms["scale_shift_table"]  # a root tensor: no LoRA key spells it in diffusers' names
    path = write_lora(lora, tmp_path / "d.safetensors", "transformer")
    assert "transformer.blocks.1.diff_m" in load_file(path)
    convert(src, tmp_path / "out", "wan-diffusers-fp8", steps=[open_loras([path])], workers=2)
    merged = merged_source(src, tmp_path / "merged", [lora], rel="transformer")
    convert(merged, tmp_path / "direct", "wan-diffusers-fp8", workers=2)
    assert_same_output(tmp_path / "out", tmp_path / "direct")


def test_loras_add_in_the_order_given(tmp_path):
    """(W + a) + b is not (W + b) + a in float32: the order given is the order summed."""
    src = tmp_path / "src"
    src.mkdir()
    save_file({"blocks.0.norm3.weight": torch.ones(4)}, src / "model.safetensors")
    tensors = open_component(src).tensors
    for name, value in (("a", 2.0**-24), ("b", -(2.0**-24))):
        save_file(
            {"diffusion_model.blocks.0.norm3.diff": torch.full((4,), value)}, tmp_path / f"{name}.safetensors"
        )

    def merged(*names: str) -> torch.Tensor:
        merge = LoraMerge([open_lora(LoraSpec(tmp_path / f"{n}.safetensors")) for n in names])
        (transform,) = merge.transforms_for(".", tensors).values()
        return transform.apply(torch.ones(4), 0, 4)

    assert torch.equal(merged("a", "b"), torch.full((4,), 1 - 2.0**-24))  # 1 + 2^-24 rounds to 1 first
    assert torch.equal(merged("b", "a"), torch.ones(4))  # 1 - 2^-24 is exact, and back
    assert not torch.equal(merged("a", "b"), merged("b", "a"))


@pytest.mark.parametrize(
    "recipe",
    ["wan-torchao-fp8", "wan-nf4", "wan-comfy-fp8", "wan-comfy-int8", "wan-gguf-q8_0", "wan-gguf-q4_k_m"],
)
def test_every_format(recipe, make_wan, tmp_path):
    src = make_wan("t2v", preset="small" if "gguf" in recipe else "tiny")
    lora = make_lora(src, seed=4, alpha=torch.tensor(RANK * 2.0))
    path = write_lora(lora, tmp_path / "l.safetensors")
    convert(src, tmp_path / "out", recipe, steps=[open_loras([path])], workers=2)
    convert(merged_source(src, tmp_path / "merged", [lora]), tmp_path / "direct", recipe, workers=2)
    assert_same_output(tmp_path / "out", tmp_path / "direct")
    assert verify(tmp_path / "out", src).ok  # found at its recorded path, re-applied


def test_loras_apply_in_order_with_strengths_and_one_per_component(make_wan, tmp_path, monkeypatch):
    """Two experts: a LoRA for one expert only, then one for both, through the CLI; verify re-applies them."""
    monkeypatch.chdir(tmp_path)
    src = make_wan("a14b")
    high = make_lora(src, seed=5, rel="high_noise_model", alpha=torch.tensor(1.5))
    high.strength = 0.5
    both = [make_lora(src, seed=6, rel=rel, diffs=False) for rel in ("high_noise_model", "low_noise_model")]
    both[0].terms = both[1].terms  # one file for both experts
    write_lora(high, Path("high.safetensors"))
    write_lora(both[0], Path("both.safetensors"), "kohya")
    run_cli(
        "convert", src, "out", "--recipe", "wan2.2-a14b-fp8",
        "--lora", "high_noise_model=high.safetensors:0.5", "--lora", "both.safetensors", check=True,
    )  # fmt: skip
    merged = merged_source(src, tmp_path / "merged", [high, both[0]], rel="high_noise_model")
    merged_source(src, merged, [both[0]], rel="low_noise_model")
    convert(merged, tmp_path / "direct", "wan2.2-a14b-fp8", workers=2)
    assert_same_output(tmp_path / "out", tmp_path / "direct")
    # the other order is another model: float32 sums in the order given
    manifest = read_json(Path("out/quantize_manifest.json"))
    (record,) = manifest["steps"]
    assert record["step"] == "lora" and record["unmatched"] == "error"
    assert [(e["file"], e["strength"], e["component"]) for e in record["loras"]] == [
        ("high.safetensors", 0.5, "high_noise_model"),
        ("both.safetensors", 1.0, None),
    ]
    pairs = len(both[0].terms)  # a low-rank pair on every block Linear, in each expert
    assert record["loras"][1]["tensors"] == {"high_noise_model": pairs, "low_noise_model": pairs}
    card = Path("out/README.md").read_text()
    assert (
        "## LoRAs merged before quantizing" in card
        and "| `high.safetensors` | 0.5 | high_noise_model |" in card
    )
    ok = run_cli("verify", "out", "--source", src)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "LoRA sha256" in ok.stdout
    # moved away: verify says where it looked and what to do; given again with --lora, found by SHA-256
    Path("moved").mkdir()
    shutil.move("both.safetensors", "moved/renamed.safetensors")
    missing = run_cli("verify", "out", "--source", src)
    assert (
        missing.returncode == 2 and "LoRA 'both.safetensors'" in missing.stderr and "--lora" in missing.stderr
    )
    found = run_cli("verify", "out", "--source", src, "--lora", "moved/renamed.safetensors")
    assert found.returncode == 0, found.stdout + found.stderr
    # a different LoRA under the recorded name: provenance and parity fail, naming it
    write_lora(make_lora(src, seed=9, rel="high_noise_model", diffs=False), Path("both.safetensors"), "kohya")
    wrong = run_cli("verify", "out", "--source", src)
    assert wrong.returncode == 1 and "SHA-256 differs from that of LoRA 'both.safetensors'" in wrong.stdout


def test_verify_takes_the_loras_from_the_manifest_or_from_lora(make_wan, tmp_path):
    src = make_wan("t2v")
    (tmp_path / "loras").mkdir()
    path = write_lora(make_lora(src, seed=7), tmp_path / "loras" / "l.safetensors")
    convert(src, tmp_path / "out", "wan-fp8", steps=[open_loras([path])], workers=2)
    with pytest.raises(
        InputError, match=r"LoRA 'l.safetensors' the checkpoint was made with is not at l.safetensors, "
    ):
        verify(tmp_path / "out", src)  # not in the working directory, nor in or beside the source
    assert verify(tmp_path / "out", src, step_files=[path]).ok
    shutil.copy(path, src.parent / "l.safetensors")  # beside the source
    assert verify(tmp_path / "out", src).ok
    convert(src, tmp_path / "plain", "wan-fp8", workers=2)
    with pytest.raises(InputError, match="converted without LoRAs"):
        verify(tmp_path / "plain", src, step_files=[path])


def test_a_manifest_written_before_steps_recorded_themselves_still_verifies(make_wan, tmp_path):
    """Earlier manifests keep the LoRAs in a top-level `loras` list (no `unmatched`): read as the LoRA step."""
    src = make_wan("t2v")
    path = write_lora(make_lora(src, seed=7), tmp_path / "l.safetensors")
    convert(src, tmp_path / "out", "wan-fp8", steps=[open_loras([path])], workers=2)
    manifest_path = tmp_path / "out" / "quantize_manifest.json"
    data = read_json(manifest_path)
    (record,) = data.pop("steps")
    legacy = {**data, "loras": record["loras"]}  # the shape of the earlier manifests, key order kept
    manifest_path.write_text(json.dumps(legacy, indent=2) + "\n")
    report = verify(tmp_path / "out", src, step_files=[path])
    assert report.ok, report
    assert {("parity", "LoRAs"), ("provenance", "LoRA sha256")} <= set(report.checks)
    # and a record of no known kind is named
    manifest_path.write_text(json.dumps({**data, "steps": [{"step": "dora"}]}, indent=2) + "\n")
    with pytest.raises(InputError, match="manifest step 'dora' is not a recorded step"):
        verify(tmp_path / "out", src)


# --- a second oracle: PEFT through diffusers ---------------------------------------------------


def test_peft_fuse_lora_agrees_up_to_bf16_rounding(tmp_path):
    import diffusers

    src = diffusers_wan(tmp_path / "src" / "transformer").parent
    lora = make_lora(src, seed=8, diffs=False, rel="transformer")
    path = write_lora(lora, tmp_path / "peft.safetensors", "transformer")
    model = diffusers.WanTransformer3DModel.from_pretrained(src / "transformer", torch_dtype=torch.bfloat16)
    model.load_lora_adapter(load_file(path), prefix="transformer", adapter_name="style")
    model.fuse_lora(lora_scale=0.6)
    fused = {k.replace(".base_layer", ""): v for k, v in model.state_dict().items() if "lora_" not in k}
    merge = LoraMerge([open_lora(LoraSpec(path, 0.6))])
    plan = make_plan(src, load_recipe("wan-diffusers-fp8").recipe, steps=[merge])
    (cp,) = plan.components
    changed = 0
    for tp in cp.tensors:
        ours = tp.source.read()
        theirs = fused[tp.name]
        if tp.name in lora.terms:
            changed += 1
            assert not torch.equal(ours, open_source_tensor(src, tp.name))
            # PEFT rounds the product to bf16 before adding it; ours adds in float32 and rounds once
            torch.testing.assert_close(ours.float(), theirs.float(), rtol=2**-7, atol=1e-3)
        else:
            assert torch.equal(ours, theirs), tp.name
    assert changed == len(lora.terms) == merge.touched[0]["transformer"]


def open_source_tensor(src: Path, name: str) -> torch.Tensor:
    from quantize.read.tensor_source import TensorSource

    return TensorSource(open_component(src, "transformer").tensors[name]).read()


# --- streaming ---------------------------------------------------------------------------------


def test_the_merge_reads_only_the_rows_it_converts(wan_tiny, tmp_path, monkeypatch):
    import quantize.steps.lora as lora_mod

    lora = make_lora(wan_tiny, seed=10, diffs=False)
    path = write_lora(lora, tmp_path / "l.safetensors")
    merge = LoraMerge([open_lora(LoraSpec(path))])
    tensors = open_component(wan_tiny).tensors
    name = "blocks.0.ffn.0.weight"
    n = tensors[name].shape[0]  # its rows
    transform = merge.transforms_for(".", tensors)[name]
    reads = []
    real = lora_mod.read_rows
    monkeypatch.setattr(
        lora_mod, "read_rows", lambda info, r0, r1: reads.append((info.name, r0, r1)) or real(info, r0, r1)
    )
    from quantize.read.tensor_source import TensorSource

    source = TensorSource(tensors[name], (transform,))
    whole = source.read()
    up = [r for r in reads if r[0].endswith("lora_up.weight")]
    assert up == [("diffusion_model.blocks.0.ffn.0.lora_up.weight", 0, n)]
    reads.clear()
    for chunk in (1, 2, 7, 64):  # any chunking gives the same bits, a lone row included
        rows = [source.read_rows(r0, min(r0 + chunk, n)) for r0 in range(0, n, chunk)]
        assert torch.equal(torch.cat(rows), whole), chunk
    up = [r for r in reads if r[0].endswith("lora_up.weight")]
    assert max(r1 - r0 for _, r0, r1 in up) <= 64 and all(r1 - r0 <= 2 for _, r0, r1 in up[:n])


# --- bad input: one line, exit 2, nothing written -------------------------------------------------


def _refused(args, match: str, tmp_path: Path) -> None:
    proc = run_cli(*args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and match in lines[0], proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_key_that_matches_nothing_is_refused_naming_it(wan_tiny, make_wan, tmp_path):
    i2v = make_wan("i2v")
    lora = make_lora(
        i2v, seed=11, linears="blocks.0.cross_attn.", diffs=False
    )  # k_img, v_img: only an I2V model has them
    path = write_lora(lora, tmp_path / "i2v.safetensors")
    _refused(
        ["convert", wan_tiny, tmp_path / "out", "--recipe", "wan-fp8", "--lora", path],
        "key 'diffusion_model.blocks.0.cross_attn.k_img.lora_down.weight' matches no tensor of the model",
        tmp_path,
    )
    # opted in: skipped, and listed in the manifest, the card, plan and inspect
    plan = run_cli(
        "plan", wan_tiny, "--recipe", "wan-fp8", "--lora", path, "--lora-unmatched", "ignore", check=True
    )
    assert "i2v.safetensors: skipped in . (match no tensor)" in plan.stdout
    ignore = ["--recipe", "wan-fp8", "--lora", path, "--lora-unmatched", "ignore"]
    run_cli("convert", wan_tiny, tmp_path / "out", *ignore, check=True)
    ((entry,),) = [r["loras"] for r in read_json(tmp_path / "out" / "quantize_manifest.json")["steps"]]
    assert entry["tensors"] == {".": 4} and sorted(entry["ignored"]["."]) == sorted(
        f"diffusion_model.blocks.0.cross_attn.{m}.lora_{r}.weight"
        for m in ("k_img", "v_img")
        for r in ("down", "up")
    )
    assert "blocks.0.cross_attn.k_img.lora_down.weight`" in (tmp_path / "out" / "README.md").read_text()
    assert run_cli("verify", tmp_path / "out", "--source", wan_tiny, "--lora", path).returncode == 0
    inspect = run_cli("inspect", tmp_path / "out", check=True).stdout
    assert "merged LoRA" in inspect and "skipped 4 keys" in inspect


def test_a_shape_mismatch_names_both_shapes(wan_tiny, make_wan, tmp_path):
    other = make_wan("t2v", preset="small")
    lora = make_lora(other, seed=12, linears="blocks.0.self_attn.q", diffs=False)
    path = write_lora(lora, tmp_path / "big.safetensors")
    big = open_component(other).tensors["blocks.0.self_attn.q.weight"].shape[0]
    small = list(open_component(wan_tiny).tensors["blocks.0.self_attn.q.weight"].shape)
    assert big != small[0]
    _refused(
        ["convert", wan_tiny, tmp_path / "out", "--recipe", "wan-fp8", "--lora", path],
        f"[{big}, 4] and 'diffusion_model.blocks.0.self_attn.q.lora_down.weight' [4, {big}] do not fit tensor "
        f"'blocks.0.self_attn.q.weight' {small}",
        tmp_path,
    )


@pytest.mark.parametrize(
    "content, match",
    [
        (b"not a safetensors file at all", "not.safetensors: header length"),
        (None, "missing.safetensors: LoRA file not found"),
    ],
)
def test_an_unreadable_lora_is_refused_before_any_work(content, match, wan_tiny, tmp_path):
    path = tmp_path / ("not.safetensors" if content else "missing.safetensors")
    if content:
        path.write_bytes(content)
    _refused(["convert", wan_tiny, tmp_path / "out", "--recipe", "wan-fp8", "--lora", path], match, tmp_path)
    _refused(["plan", wan_tiny, "--recipe", "wan-fp8", "--lora", path], match, tmp_path)


@pytest.mark.parametrize(
    "tensors, match",
    [
        (
            {"diffusion_model.blocks.0.ffn.0.hada_w1_a": torch.zeros(2, 2)},
            "is a LyCORIS (LoHa/LoKr) or DoRA weight",
        ),
        (
            {"diffusion_model.blocks.0.ffn.0.lokr_w1": torch.zeros(2, 2)},
            "'diffusion_model.blocks.0.ffn.0.lokr_w1' is a LyCORIS",
        ),
        (
            {"diffusion_model.blocks.0.ffn.0.lora_down.weight": torch.zeros(4, 64)},
            "has no matching lora_up weight",
        ),
        (
            {"diffusion_model.blocks.0.ffn.0.weight": torch.zeros(4, 64)},
            "is not a LoRA key of a known convention",
        ),
        (
            {
                "diffusion_model.blocks.0.ffn.0.lora_down.weight": torch.zeros(4, 64),
                "diffusion_model.blocks.0.ffn.0.lora_up.weight": torch.zeros(192, 4),
                "diffusion_model.blocks.0.ffn.0.alpha": torch.tensor(float("nan")),
            },
            "is nan; an alpha must be a finite number",
        ),
    ],
    ids=["loha", "lokr", "half-pair", "full-weight", "nan-alpha"],
)
def test_keys_of_no_known_convention_are_refused_naming_them(tensors, match, wan_tiny, tmp_path):
    path = tmp_path / "x.safetensors"
    save_file(tensors, path)
    _refused(["convert", wan_tiny, tmp_path / "out", "--recipe", "wan-fp8", "--lora", path], match, tmp_path)


def test_bad_lora_arguments(wan_tiny, tmp_path):
    path = write_lora(make_lora(wan_tiny, seed=13, diffs=False), tmp_path / "l.safetensors")
    _refused(
        ["convert", wan_tiny, tmp_path / "out", "--recipe", "wan-fp8", "--lora", f"high_noise_model={path}"],
        "component 'high_noise_model' is not one the recipe converts (.)",
        tmp_path,
    )
    _refused(
        ["convert", wan_tiny, tmp_path / "out", "--recipe", "wan-fp8", "--lora", f"{path}:strong"],
        "strength 'strong' is not a number",
        tmp_path,
    )


def test_a_lora_kept_in_the_source_folder_is_not_copied_into_the_output(make_wan, tmp_path, monkeypatch):
    src = make_wan("t2v")
    (src / "loras").mkdir()
    monkeypatch.chdir(tmp_path)
    path = write_lora(make_lora(src, seed=17), Path(src.name) / "loras" / "style.safetensors")
    manifest = convert(src, tmp_path / "out", "wan-fp8", steps=[open_loras([path])], workers=2)
    assert recorded_loras(manifest)[0].file == f"{src.name}/loras/style.safetensors"  # relative, as given
    assert (tmp_path / "out" / "example.json").is_file()  # the recipe copies the source's other files
    assert not (tmp_path / "out" / "loras").exists()
    assert verify(tmp_path / "out", src).ok  # found at the recorded path


def test_ignore_still_refuses_a_lora_that_matches_nothing(wan_tiny, make_wan, tmp_path):
    other = make_wan("i2v")
    lora = make_lora(other, seed=18, linears="img_emb.", diffs=False)
    path = write_lora(lora, tmp_path / "img.safetensors")
    ignore = ["--recipe", "wan-fp8", "--lora", path, "--lora-unmatched", "ignore"]
    _refused(
        ["convert", wan_tiny, tmp_path / "out", *ignore],
        "none of its keys matches a tensor of the model",
        tmp_path,
    )


def test_verify_lora_arguments(wan_tiny, tmp_path):
    path = write_lora(make_lora(wan_tiny, seed=19), tmp_path / "l.safetensors")
    convert(wan_tiny, tmp_path / "out", "wan-fp8", steps=[open_loras([path])], workers=2)
    no_source = run_cli("verify", tmp_path / "out", "--lora", path)
    assert no_source.returncode == 2 and "give --source too" in no_source.stderr
    missing = run_cli(
        "verify", tmp_path / "out", "--source", wan_tiny, "--lora", tmp_path / "gone.safetensors"
    )
    assert missing.returncode == 2 and "gone.safetensors" in missing.stderr


def test_lora_specs_parse(tmp_path, monkeypatch):
    assert LoraSpec.parse("a.safetensors") == LoraSpec(Path("a.safetensors"))
    assert LoraSpec.parse("dir/a.safetensors:0.5") == LoraSpec(Path("dir/a.safetensors"), 0.5)
    assert LoraSpec.parse("transformer_2=a.safetensors:-1") == LoraSpec(
        Path("a.safetensors"), -1.0, "transformer_2"
    )
    assert LoraSpec.parse("x/y=z/a.safetensors") == LoraSpec(Path("x/y=z/a.safetensors"))
    with pytest.raises(InputError, match="finite"):
        LoraSpec.parse("a.safetensors:1e999")
    with pytest.raises(InputError, match="strength '1_0' is not a number"):
        LoraSpec.parse("a.safetensors:1_0")  # float() would read 10
    monkeypatch.chdir(tmp_path)
    Path("odd:0.5").write_bytes(b"")
    Path("k=v.safetensors").write_bytes(b"")
    assert LoraSpec.parse("odd:0.5") == LoraSpec(Path("odd:0.5"))  # an existing file is taken whole
    assert LoraSpec.parse("k=v.safetensors:2") == LoraSpec(Path("k=v.safetensors"), 2.0)


def test_plan_shows_what_each_lora_touches(wan_tiny, tmp_path):
    a = write_lora(make_lora(wan_tiny, seed=14), tmp_path / "a.safetensors")
    b = write_lora(
        make_lora(wan_tiny, seed=15, linears="blocks.1.ffn", diffs=False), tmp_path / "b.safetensors"
    )
    proc = run_cli("plan", wan_tiny, "--recipe", "wan-fp8", "--lora", a, "--lora", f"{b}:0.3", check=True)
    rows = [line for line in proc.stdout.splitlines() if ".safetensors" in line]
    assert len(rows) == 2
    assert rows[0].split("│")[4].strip() == "24" and rows[1].split("│")[4].strip() == "2"
    assert rows[1].split("│")[2].strip() == "0.3"
