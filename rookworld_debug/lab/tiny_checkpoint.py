"""train-tiny's checkpoints: a shippable HF folder plus STATE_FILE (optimizer, RNGs, data cursors), and the
resume's reading of it (tensors and plain values only, checked field by field)."""
from __future__ import annotations

import json
import os
from pathlib import Path

STATE_FILE = "trainer_state.pt"  # optimizer + step + RNG + data cursors, next to a checkpoint's weights


_STATE_TYPES = {"optimizer": dict, "rng": tuple, "p_order": list, "a_order": list, "pi": int, "ai": int,
                "step": int, "history": list, "ema": (float, type(None)), "train_seconds": (int, float)}


def load_state(path: Path) -> dict:
    """STATE_FILE read with ``weights_only=True`` (tensors and plain values only: nothing is unpickled by name),
    checked against the fields a resume reads; CheckpointError naming the file otherwise."""
    import pickle

    import torch

    from rookworld_debug.errors import CheckpointError
    try:
        st = torch.load(path, weights_only=True, map_location="cpu")
    except (pickle.UnpicklingError, RuntimeError, ValueError, EOFError, OSError, AttributeError, KeyError) as err:
        raise CheckpointError(f"{path} is not a train-tiny state this version reads: {type(err).__name__}: "
                              f"{str(err).splitlines()[0] if str(err) else ''}") from None
    if not isinstance(st, dict):
        raise CheckpointError(f"{path} holds a {type(st).__name__}, not train-tiny's state mapping")
    bad = [k for k, t in _STATE_TYPES.items() if not isinstance(st.get(k), t) or isinstance(st.get(k), bool)]
    if not isinstance(st.get("torch_rng"), torch.Tensor) or st["torch_rng"].dtype != torch.uint8:
        bad.append("torch_rng")
    if bad:
        raise CheckpointError(f"{path}: field(s) {bad} missing or of the wrong type (not a train-tiny state?)")
    return st


def save_checkpoint(folder: Path, model, tok, opt, meta, *, step, history, ema, train_seconds, rng, cursors):
    """A shippable HF folder plus STATE_FILE (optimizer, RNGs, data cursors) that ``--resume`` continues."""
    import torch

    _save(model, tok, folder, dict(meta, step=step, history=history, train_seconds=train_seconds))
    tmp = folder / (STATE_FILE + ".tmp")
    torch.save(dict(optimizer=opt.state_dict(), rng=rng.getstate(), torch_rng=torch.get_rng_state(), **cursors,
                    step=step, history=history, ema=float(ema), train_seconds=train_seconds), tmp)
    os.replace(tmp, folder / STATE_FILE)  # atomic: a kill mid-save keeps the last state


def _save(model, tok, folder: Path, meta: dict):
    import torch
    from transformers import GenerationConfig

    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    GenerationConfig(do_sample=True, temperature=0.5, top_p=0.9, top_k=0, max_new_tokens=256,
                     bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
                     pad_token_id=tok.eos_token_id).save_pretrained(folder)
    (folder / "training_args.json").write_text(json.dumps(meta, indent=1, default=str))
