"""`quantize verify` as the verify tests run it, and the edits they make to a converted checkpoint."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import save_file

from tests.conftest import read_json, run_cli


def verify_json(ckpt: Path, *args) -> tuple[int, dict, str]:
    """`quantize verify CKPT ARGS --json`: its exit status, its JSON report ({} when none), its stderr."""
    proc = run_cli("verify", ckpt, *args, "--json")
    report = json.loads(proc.stdout) if proc.stdout.strip() else {}
    return proc.returncode, report, proc.stderr


def forward_sqnr(ckpt: Path, source: Path) -> float:
    """`quantize verify CKPT --source SOURCE --forward`, which must pass: its one component's output SQNR (dB)."""
    code, report, err = verify_json(ckpt, "--source", source, "--forward")
    assert code == 0, err
    (sqnr,) = [v["output_sqnr_db"] for v in report["forward"].values()]
    return sqnr


def failures(report: dict) -> dict[str, list[str]]:
    """The failures of each check of a verify report that did not pass, by check name."""
    return {c["check"]: c["failures"] for c in report["checks"] if not c["ok"]}


def rehash(ckpt: Path, *paths: Path) -> None:
    """Make the manifest agree with changed files, so that only the structural checks can object."""
    manifest = read_json(ckpt / "quantize_manifest.json")
    for entry in manifest["output_files"]:
        p = ckpt / entry["path"]
        if p in paths:
            entry["size"] = p.stat().st_size
            entry["sha256"] = hashlib.sha256(p.read_bytes()).hexdigest()
    (ckpt / "quantize_manifest.json").write_text(json.dumps(manifest, indent=2))


def rewrite(shard: Path, mutate) -> None:
    """Rewrite the safetensors file `shard` (its metadata kept) with its tensors as `mutate(tensors)` leaves them."""
    with safe_open(shard, framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        metadata = f.metadata()
    mutate(tensors)
    save_file(tensors, shard, metadata=metadata)
