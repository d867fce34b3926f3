"""Fuzzing a recorded step folder with its weights: one real step of a micro GPT-2 recorded by StepRecorder, then
seeded mutations of a fresh copy of it (state.json's tree; the safetensors files' headers, bytes and values, the
manifest re-hashed in half the cases so the mutation reaches the safetensors parser and the shape and dtype checks;
the manifest and its `files`; the file system: files deleted, replaced by folders, links inside and out, empty
files, FIFOs; trace.json's tree). On each, `diagnose FOLDER --json` (with its replay) ends in a named error or in
findings whose JSON is strict ASCII, no check crashes, no canary file appears and no case runs past its deadline.
~250 mutations in the default run, 2,100 in the slow one (counts in the terminal summary)."""
from __future__ import annotations

import copy
import json
import math
import os
import random
import shutil
import signal
import struct
import time
import traceback
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from test_triage_fuzz import _atoms, _mutate_tree, _text

from rookworld_debug.errors import RookWorldError

KINDS = ("state.json", "safetensors header", "tensor values", "manifest", "file system", "trace.json")
WEIGHTS = ("before", "after", "gradient", "reference", "optimizer", "sampler")
DTYPES = ("F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "U16", "U32", "U64", "BOOL", "F8_E4M3",
          "F8_E5M2", "C64", "F4", "XX", "f32", "")
DEADLINE_S = 60.0
REFUSED = ("named error", "named error in the replay")


# ------------------------------------------------------------------------------------------ the seed step
G, BETA = 2, 0.04
PROMPTS = ["P: k7/8/8/8/8/8/8/K7 w - - 0 1", "P: 7k/8/8/8/8/8/8/K7 w - - 0 1"]
LABELS = [" M: a1a2 a1b1      E: 0.0 0.0      B: a1a2", " M: a1b2 a1a2      E: 0.1 0.0      B: a1b2"]
# the rollout's texts: a random micro model samples unterminated bytes that all score alike (no signal), so the
# loop is handed completions that end in EOS and score apart, as a sampler that drew them would
ROWS = [" B: a1a2", " M: a1a2", " B: a1b2", " M: a1b1 B: a1a2"]


def _logps(model, p_ids, p_mask, ids, mask):
    """(N, T) teacher-forced log-probs at temperature 1, positions counting real tokens only."""
    full, attn = torch.cat([p_ids, ids], 1), torch.cat([p_mask, mask], 1)
    pos = (attn.cumsum(1) - 1).clamp(min=0)
    logits = model(input_ids=full, attention_mask=attn, position_ids=pos).logits[:, p_ids.shape[1] - 1:-1]
    return logits.float().log_softmax(-1).gather(-1, ids[..., None]).squeeze(-1) * mask


def _rollout(tok):
    from rookworld_debug.trl.rewards import rookworld_reward_funcs
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    p_ids, p_mask = enc.input_ids.repeat_interleave(G, 0), enc.attention_mask.repeat_interleave(G, 0)
    ids = tok([r + tok.eos_token for r in ROWS], return_tensors="pt", padding=True, padding_side="right").input_ids
    mask = (ids.eq(tok.eos_token_id).int().cumsum(1).cumsum(1) <= 1).long()      # through the first EOS
    texts = tok.batch_decode(ids * mask + tok.eos_token_id * (1 - mask), skip_special_tokens=True)
    rows_p, rows_l = [p for p in PROMPTS for _ in range(G)], [x for x in LABELS for _ in range(G)]
    cols = [f(prompts=rows_p, completions=texts, label=rows_l) for f in rookworld_reward_funcs("dataset")]
    r = torch.tensor([sum(v for v in vals if v is not None) for vals in zip(*cols)])
    g = r.view(-1, G)
    adv = ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + 1e-4)).reshape(-1)   # TRL's group advantages
    return p_ids, p_mask, ids, mask, texts, r, adv


def _grpo_step(model, ref, opt, tok, rec=None) -> None:
    """TRL's GRPO (PPO-clip ε 0.2, β·k3 KL × ratio, per-sequence means, ÷ N), clip 1.0, one AdamW step."""
    p_ids, p_mask, ids, mask, texts, r, adv = _rollout(tok)
    if rec is not None:
        rec.batch(PROMPTS, labels=LABELS)
        rec.sampler(copy.deepcopy(model))              # a sampler copy, synced before the rollout
        rec.model_before(model, opt, reference=ref)
    with torch.no_grad():
        sampled, ref_lp = _logps(model, p_ids, p_mask, ids, mask), _logps(ref, p_ids, p_mask, ids, mask)
    opt.zero_grad()
    lp = _logps(model, p_ids, p_mask, ids, mask)
    ratio, a = torch.exp(lp - lp.detach()), adv[:, None]
    d = ref_lp - lp
    per_token = -torch.min(ratio * a, ratio.clamp(0.8, 1.2) * a) + BETA * (d.exp() - d - 1) * ratio
    m = mask.float()
    loss = ((per_token * m).sum(1) / m.sum(1).clamp(min=1)).sum() / ids.shape[0]
    loss.backward()
    if rec is not None:
        rec.rollout(prompt_ids=p_ids, prompt_mask=p_mask, completion_ids=ids, completion_mask=mask,
                    completions=texts, sampling_logps=sampled)
        rec.rewards(r, per_func={"rookworld": r})
        rec.advantages(adv)
        rec.logprobs(lp.detach(), ref=ref_lp, training=model.training)
        rec.loss(loss.detach())
        rec.gradient(model)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    if rec is not None:
        rec.model_after(model)


def record_seed(folder: Path) -> Path:
    """Two GRPO steps of a micro GPT-2 (1 layer, width 16, the embedded tokenizer's 257 ids), the second recorded
    with its weights, optimizer state, reference and sampler."""
    from transformers import GPT2Config, GPT2LMHeadModel
    from tinymodels import embedded_tokenizer

    from rookworld_debug.record import StepRecorder
    tok = embedded_tokenizer()
    eos = tok.eos_token_id
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, n_positions=64, vocab_size=len(tok),
                                           bos_token_id=eos, eos_token_id=eos)).eval()
    ref = copy.deepcopy(model).requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _grpo_step(model, ref, opt, tok)                   # the recorded step's optimizer holds moments
    rec = StepRecorder(tok, trainer="step-folder fuzz seed", step=2, loss_type="grpo", num_generations=G,
                       beta=BETA, temperature=1.0, reward_mode="dataset", max_grad_norm=1.0)
    _grpo_step(model, ref, opt, tok, rec)
    return rec.save(folder)


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """The micro model's ops are tiny: a second thread only waits, on a machine other processes share."""
    was = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(was)


@pytest.fixture(scope="module")
def seed(tmp_path_factory) -> Path:
    return record_seed(tmp_path_factory.mktemp("seed") / "step")


def test_the_seed_replays_clean_and_fast(seed):
    """The unmutated seed: every phase replayed and agreeing, no error-level finding, well under a second."""
    from rookworld_debug.diagnosis.registry import folder_diagnosis
    folder_diagnosis(seed)                             # warm (imports, the reward tables)
    t0 = time.perf_counter()
    found, replays, _ = folder_diagnosis(seed)
    seconds = time.perf_counter() - t0
    assert not [(f.code, f.cause) for f in found if f.severity == "error" or f.code == "check_failed"]
    status = {p["phase"]: p["status"] for p in replays[None].phases()}
    # its completions are written, not sampled (ROWS): the test of the tokens a sampler chose may warn, no more
    assert status.pop("generation") in ("agree", "suspect") and list(status.values()) == ["agree"] * 6, status
    assert set(json.loads((seed / "state" / "state.json").read_text())["files"]) == set(WEIGHTS)
    assert seconds < 1.0, seconds


# ------------------------------------------------------------------------------------------ the oracle
class _Overdue(BaseException):
    """A case past its deadline (a BaseException: no check's guard may turn it into a finding)."""


@contextmanager
def _deadline(seconds: float):
    def alarm(signum, frame):
        raise _Overdue(f"past its {seconds:.0f} s deadline")
    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _diagnose(folder: Path) -> str:
    """What `diagnose FOLDER --json` prints (its whole payload, replays included, held to strict ASCII JSON), or
    "named error". No check may fail: saved files the replay refuses are the `recorded_step_refused` finding."""
    from rookworld_debug.cli_diagnose import as_json
    from rookworld_debug.diagnosis.registry import folder_diagnosis
    try:
        found, replays, pairs = folder_diagnosis(folder)
    except RookWorldError:
        return "named error"
    text = json.dumps(as_json(str(folder), found, replays, pairs), ensure_ascii=True, allow_nan=False)
    json.loads(text.encode("ascii"))
    failed = [f.cause for f in found if f.code == "check_failed"]
    assert not failed, failed
    return "named error in the replay" if any(f.code == "recorded_step_refused" for f in found) else "findings"


# ------------------------------------------------------------------------------------------ mutations
def _state(folder: Path) -> dict:
    return json.loads((folder / "state" / "state.json").read_text())


def _write_state(folder: Path, d) -> None:
    (folder / "state" / "state.json").write_text(json.dumps(d, allow_nan=True))


def _rehash(folder: Path, name: str) -> None:
    from rookworld_debug.grpo.trace.state import _sha256
    d = _state(folder)
    d["sha256"][name] = _sha256(folder / "state" / f"{name}.safetensors")
    _write_state(folder, d)


def _split(data: bytes) -> tuple[dict, bytes]:
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + n]), data[8 + n:]


def _joined(header, body: bytes) -> bytes:
    h = json.dumps(header, allow_nan=True).encode("utf-8", "surrogatepass")
    return struct.pack("<Q", len(h)) + h + body


def _flip(data: bytes, rng: random.Random, end: int | None = None) -> bytes:
    i = rng.randrange(min(len(data), end or len(data)))
    return data[:i] + bytes([data[i] ^ (1 << rng.randrange(8))]) + data[i + 1:]


def _shape(shape: list, rng: random.Random, atoms: list):
    op = rng.randrange(7)
    if op == 0 and len(shape) == 2:
        return shape[::-1]                                 # same bytes: only the shape check can tell
    if op == 1:
        return [math.prod(shape)]                          # flattened, same bytes
    if op == 2:
        return [1, *shape]
    if op == 3:
        return shape[:-1] + [shape[-1] + rng.choice((-1, 1))]
    if op == 4:
        return [rng.choice((0, -1, 2 ** 31, 2 ** 63, 2 ** 64)), *shape[1:]]
    if op == 5:
        return []
    return rng.choice(atoms)


def _entry(header: dict, rng: random.Random, atoms: list) -> None:
    """One tensor entry's dtype, shape or offsets changed."""
    names = [k for k in header if k != "__metadata__"]
    e = header[rng.choice(names)]
    op = rng.randrange(3)
    if op == 0:
        e["dtype"] = rng.choice(DTYPES + ("I32", "U32") * 3)  # I32/U32: an F32 tensor's own byte size
    elif op == 1:
        e["shape"] = _shape(list(e["shape"]), rng, atoms)
    else:
        a, b = e["data_offsets"]
        e["data_offsets"] = rng.choice([[b, a], [a, b - 4], [a + 4, b + 4], [a, b + 10 ** 9], [-a, b], [a, a],
                                        [a, 2 ** 64], [str(a), b], [a], rng.choice(atoms)])


def _names(header: dict, rng: random.Random, atoms: list) -> None:
    """A tensor renamed, dropped, doubled or two names swapped."""
    names = [k for k in header if k != "__metadata__"]
    a, b = rng.sample(names, 2)
    op = rng.randrange(5)
    if op == 0:
        header[a], header[b] = header[b], header[a]        # same shapes: only the replay can tell
    elif op == 1:
        new = rng.choice(["transformer.h.1.ln_1.weight", "lm_head.weight", "x/y", "step/" + a, "",
                          str(rng.choice(atoms))[:300]])
        header[new] = header.pop(a)
    elif op == 2:
        del header[a]
    elif op == 3:
        header[a + ".copy"] = dict(header[a])
    else:
        header[b] = header.pop(a)


def _metadata(header: dict, rng: random.Random, atoms: list) -> None:
    header["__metadata__"] = copy.deepcopy(rng.choice([{"format": "pt"}, {"format": 1}, {"a": ["b"]}, None, [],
                                                       "x", {"format": rng.choice(atoms)}, rng.choice(atoms)]))


def _header_bytes(data: bytes, rng: random.Random, atoms: list) -> bytes:
    """The safetensors file's bytes with its header length, its JSON header or its bytes mutated."""
    header, body = _split(data)
    op = rng.randrange(9)
    if op == 0:
        n = rng.choice([0, 1, 7, len(data) - 8, len(data), 2 ** 31, 2 ** 63, 2 ** 64 - 1, 100_000_001])
        return struct.pack("<Q", n) + data[8:]
    if op == 1:
        return data[:rng.randrange(len(data))]             # truncated
    if op == 2:
        return _flip(data, rng, end=8 + len(json.dumps(header)) if rng.random() < 0.7 else None)
    if op == 3:
        return _joined(header, body) + rng.choice([b"\x00" * 8, b"x", body])   # bytes past the last tensor
    if op == 4:
        raw = _joined(header, body)
        return raw[:8] + rng.choice([b" " * 8, b"\xef\xbb\xbf", b"\xff"]) + raw[8:]
    if op == 5:
        _entry(header, rng, atoms)
    elif op == 6:
        _names(header, rng, atoms)
    elif op == 7:
        _metadata(header, rng, atoms)
    else:
        header = _mutate_tree(header, rng, atoms)
    return _joined(header, body)


def _weights_file(folder: Path, rng: random.Random) -> tuple[str, Path]:
    name = rng.choice(WEIGHTS)
    return name, folder / "state" / f"{name}.safetensors"


def mutate_header(folder: Path, rng: random.Random, atoms: list) -> None:
    """A weights file's header or bytes mutated; its hash re-recorded in half the cases."""
    name, path = _weights_file(folder, rng)
    path.write_bytes(_header_bytes(path.read_bytes(), rng, atoms))
    if rng.random() < 0.5:
        _rehash(folder, name)                              # past the hash: the parser and the checks see it


def _tensor(t: torch.Tensor, rng: random.Random):
    """`t` changed: a value NaN, ±inf or huge, its shape or dtype (the header says so), or None (dropped)."""
    t = t.clone()
    op = rng.randrange(10)
    if op < 4 and t.numel() and t.is_floating_point():
        t.view(-1)[rng.randrange(t.numel())] = (math.nan, math.inf, -math.inf, 3e38)[op]
        return t
    if op == 4:
        return t.reshape(-1) if t.ndim != 1 else t.reshape(1, -1)
    if op == 5:
        return t.T.contiguous() if t.ndim == 2 else torch.cat([t, t[:1]])
    if op == 6:
        return t.to(rng.choice((torch.float16, torch.bfloat16, torch.float64, torch.int32)))
    if op == 7:
        return t[:0]
    if op == 8:
        return torch.full_like(t, rng.choice((math.nan, 1e30, -1.0, 0.0))) if t.is_floating_point() else t * 0
    return None


def mutate_values(folder: Path, rng: random.Random, atoms: list) -> None:
    """A tensor of a weights file changed, added or dropped, the file written whole and its hash re-recorded."""
    from safetensors.torch import load_file, save_file
    name, path = _weights_file(folder, rng)
    tensors = load_file(str(path))
    key = rng.choice(sorted(tensors))
    if rng.random() < 0.2:
        tensors[rng.choice(["transformer.h.0.extra", "transformer.h.1.ln_1.weight", "step/transformer.wte.weight",
                            key + "x"])] = tensors[key].clone()
    else:
        new = _tensor(tensors[key], rng)
        tensors.pop(key) if new is None else tensors.__setitem__(key, new)
    save_file(tensors, str(path))
    _rehash(folder, name)


def mutate_state_json(folder: Path, rng: random.Random, atoms: list) -> None:
    """state.json's tree mutated (half the time with the manifest put back as it was), then its text."""
    d = _state(folder)
    kept = copy.deepcopy(d["sha256"])
    d = _mutate_tree(d, rng, atoms)
    if rng.random() < 0.5 and isinstance(d, dict):
        d["sha256"] = kept                                 # the manifest left alone
    (folder / "state" / "state.json").write_bytes(_text(d, rng))


def mutate_manifest(folder: Path, rng: random.Random, atoms: list) -> None:
    """sha256 entries removed, wrong, of a wrong type; the `files` list altered."""
    d = _state(folder)
    m, files = d["sha256"], d["files"]
    name = rng.choice(WEIGHTS)
    op = rng.randrange(10)
    if op == 0:
        del m[name]
        if rng.random() < 0.5:                             # no hash: damage reaches the parser
            p = folder / "state" / f"{name}.safetensors"
            p.write_bytes(_flip(p.read_bytes(), rng))
    elif op == 1:
        d["sha256"] = rng.choice([{}, [], None, "x", 0, list(m.values())])
    elif op == 2:
        m[name] = rng.choice([m[rng.choice(WEIGHTS)], m[name].upper(), m[name][:-1], m[name][:-1] + "0", ""])
    elif op == 3:
        m[name] = copy.deepcopy(rng.choice(atoms))
    elif op == 4:
        files.remove(name)                                 # a file on disk the manifest does not list
    elif op == 5:
        files.remove(name)
        (folder / "state" / f"{name}.safetensors").unlink()
        files.append(name) if rng.random() < 0.5 else None  # listed but gone
    elif op == 6:
        files.insert(rng.randrange(len(files) + 1), rng.choice(files))
    elif op == 7:
        rng.shuffle(files)
    elif op == 8:
        files.append(copy.deepcopy(rng.choice(atoms + ["tokenizer", "state", "../before", "trace", "Before"])))
    else:
        d["files"] = rng.choice([[], None, "before", {"before": 1}, [["before"]], list(WEIGHTS) * 50])
    _write_state(folder, d)


FS_TARGETS = [*(f"state/{n}.safetensors" for n in WEIGHTS), "state/state.json", "trace.json", "trace.safetensors",
              "state/tokenizer/tokenizer.json", "state/tokenizer", "state"]


def _remove(p: Path) -> None:
    shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()


def mutate_file_system(folder: Path, rng: random.Random, atoms: list) -> None:
    """A file or folder deleted, replaced by a folder, an empty file, a FIFO or a link: to a sibling, to itself,
    to nothing, or to its own content moved out of the step folder."""
    p = folder / rng.choice(FS_TARGETS)
    op = rng.randrange(7)
    if op == 6:
        outside = folder.parent / f"{folder.name}-outside-{p.name}"
        p.rename(outside)
        p.symlink_to(outside, target_is_directory=outside.is_dir())
        return
    _remove(p)
    if op == 1:
        p.mkdir()
    elif op == 2:
        p.write_bytes(b"")
    elif op == 3:
        os.mkfifo(p)                                       # a reader that opens it would wait forever
    elif op == 4:
        sib = rng.choice([q for q in p.parent.iterdir() if q.name != p.name] or [p.parent])
        p.symlink_to(sib.name if rng.random() < 0.5 else sib.resolve())
    elif op == 5:
        p.symlink_to(rng.choice([p.name, "missing", "/", "/dev/zero", "/etc/passwd"]))


def mutate_trace_json(folder: Path, rng: random.Random, atoms: list) -> None:
    """trace.json's tree mutated, then its text."""
    p = folder / "trace.json"
    p.write_bytes(_text(_mutate_tree(json.loads(p.read_text()), rng, atoms), rng))


MUTATE = dict(zip(KINDS, (mutate_state_json, mutate_header, mutate_values, mutate_manifest, mutate_file_system,
                          mutate_trace_json)))


# ------------------------------------------------------------------------------------------ the fuzzer
def _one(kind: str, seed: Path, root: Path, i: int, rng: random.Random, atoms: list) -> str:
    case = root / f"case-{i}"
    shutil.copytree(seed, case, symlinks=True)
    try:
        MUTATE[kind](case, rng, atoms)
        return _diagnose(case)
    finally:
        for p in root.iterdir():
            _remove(p)


def _fuzz(seed: Path, tmp_path: Path, per_kind: int, rng_seed: int, counts: dict) -> dict:
    canary = tmp_path / "CANARY"
    root = tmp_path / "cases"
    root.mkdir()
    atoms = _atoms(canary)
    rng = random.Random(rng_seed)
    outcomes: dict = {}
    for i in range(per_kind * len(KINDS)):
        kind = KINDS[i % len(KINDS)]
        t0 = time.perf_counter()
        try:
            with _deadline(DEADLINE_S):
                got = _one(kind, seed, root, i, rng, atoms)
        except (Exception, _Overdue):  # noqa: BLE001 - the failure report: which mutation, what escaped
            pytest.fail(f"mutation {i} of {kind} (seed {rng_seed}) escaped:\n{traceback.format_exc()}")
        assert time.perf_counter() - t0 < DEADLINE_S, f"mutation {i} of {kind} (seed {rng_seed}) ran past its deadline"
        assert not canary.exists(), f"mutation {i} of {kind} (seed {rng_seed}) made a reader run a command"
        outcomes.setdefault(kind, {}).setdefault(got, 0)
        outcomes[kind][got] += 1
        label = f"diagnose recorded step folders: {kind}"
        counts[label] = counts.get(label, 0) + 1
    assert not list(tmp_path.rglob("CANARY")), "a mutation made a reader write a canary file"
    return outcomes


def _check(out: dict, per_kind: int) -> None:
    assert set(out) == set(KINDS) and all(sum(v.values()) == per_kind for v in out.values()), out
    for kind, v in out.items():                 # both branches: some mutations still read, some are refused
        assert v.get("findings", 0) >= 1 and sum(v.get(r, 0) for r in REFUSED) >= 1, (kind, v)


def test_fuzz_step_folders_default_run(seed, tmp_path, fuzz_counts):
    _check(_fuzz(seed, tmp_path, 42, rng_seed=21, counts=fuzz_counts), 42)


@pytest.mark.slow
def test_fuzz_step_folders_2100(seed, tmp_path, fuzz_counts):
    out = _fuzz(seed, tmp_path, 350, rng_seed=22, counts=fuzz_counts)
    print(json.dumps(out, indent=1))
    _check(out, 350)


# ------------------------------------------------------------------------------------------ what the fuzzer found
def _copy(seed: Path, tmp_path: Path) -> Path:
    shutil.copytree(seed, tmp_path / "step")
    return tmp_path / "step"


def _edit(folder: Path, **fields) -> Path:
    d = _state(folder)
    d.update(fields)
    _write_state(folder, d)
    return folder


def _resave(folder: Path, name: str, edit) -> Path:
    """state/<name>.safetensors with `edit(tensors)` applied, its header consistent and its hash re-recorded."""
    from safetensors.torch import load_file, save_file
    path = folder / "state" / f"{name}.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path))
    _rehash(folder, name)
    return folder


def _refused(folder: Path, match: str, at_read: bool = True) -> None:
    """The replay, and reading the state and building its model unless not `at_read`, refuse `folder` by a
    TraceError matching `match`."""
    from rookworld_debug.diagnosis.replay import replay_path
    from rookworld_debug.errors import TraceError
    from rookworld_debug.grpo.trace.state import build_model, read_state
    reads = (lambda: build_model(read_state(folder), read_state(folder).before),) if at_read else ()
    for read in (*reads, lambda: replay_path(folder)):
        with pytest.raises(TraceError, match=match):
            read()


@pytest.mark.parametrize("fields, match", [
    ({"files": [["before"]]}, "files must be a list of names"),                # was a TypeError (unhashable)
    ({"sha256": ["0" * 64]}, "sha256 must map"),                                # was the hashes silently unchecked
    ({"trainable": ["transformer.h.7.attn.c_attn.weight"]}, "not parameters the weights before hold"),
    ({"optimizer_settings": {"lr": "0.01"}}, "optimizer_settings lr"),         # was a TypeError in the update
    ({"optimizer_settings": {"lr": 0.01, "betas": [0.9, 0.999], "amsgrad": True}}, r"lacks \['max_exp_avg_sq'\]"),
])
def test_a_state_json_of_other_types_is_refused_by_name(seed, tmp_path, fields, match):
    _refused(_edit(_copy(seed, tmp_path), **fields), match)


def test_settings_torch_refuses_are_refused_by_name_when_the_update_is_re_run(seed, tmp_path):
    """A negative learning rate reads (a number), and the re-run's optimizer names it (was torch's ValueError)."""
    _refused(_edit(_copy(seed, tmp_path), optimizer_settings={"lr": -1.0}), "refused by torch", at_read=False)


def test_a_setting_of_another_optimizer_is_left_out(seed, tmp_path):
    """AdamW's recorded settings with SGD's momentum: not a keyword AdamW takes (was a TypeError in the update)."""
    from rookworld_debug.diagnosis.replay import replay_path
    settings = {**_state(seed)["optimizer_settings"], "momentum": 0.9, "nesterov": True}
    rep = replay_path(_edit(_copy(seed, tmp_path), optimizer_settings=settings))
    assert rep.first_disagreement is None, rep.first_disagreement


@pytest.mark.parametrize("edit, match", [
    (lambda t: t.update({"step/transformer.wte.weight": torch.zeros(2)}), "not one step count"),   # was reshape's
    (lambda t: t.update({"exp_avg/transformer.h.0.mlp.c_fc.weight":                               # was the update's
                         t["exp_avg/transformer.h.0.mlp.c_fc.weight"].T.contiguous()}), r"is \(64, 16\)"),
    (lambda t: t.update({"exp_avg_sq/transformer.wpe.weight": t["exp_avg_sq/transformer.wpe.weight"].double()}),
     "float64"),                                                                   # was cast silently
    (lambda t: t.update({"exp_avg/transformer.h.0.extra": torch.zeros(3)}), "no parameter"),
    (lambda t: t.pop("exp_avg_sq/transformer.ln_f.bias"), r"lacks \['exp_avg_sq'\]"),          # was a KeyError
])
def test_optimizer_state_is_held_to_its_parameters(seed, tmp_path, edit, match):
    _refused(_resave(_copy(seed, tmp_path), "optimizer", edit), match)


@pytest.mark.parametrize("key, value, match", [
    ("n_head", 3, "n_head"),                                      # was transformers' ValueError
    ("activation_function", "os.system", "activation_function"),  # was a KeyError
    ("layer_norm_epsilon", "1e-5", "layer_norm_epsilon"),         # was transformers' validation error
    ("n_inner", 1 << 40, "n_inner"),                              # was an allocation of a 2**40-wide MLP
    ("tie_word_embeddings", 1, "tie_word_embeddings"),
])
def test_a_model_config_of_other_types_or_sizes_is_refused_before_building(seed, tmp_path, key, value, match):
    config = {**_state(seed)["model_config"], key: value}
    _refused(_edit(_copy(seed, tmp_path), model_config=config), match)


def test_model_config_keys_a_replay_does_not_build_from_are_left_out(seed, tmp_path):
    """Dropout (off in eval mode), initialisation, token ids and output settings, of any type (each was an error of
    transformers' config validation)."""
    from rookworld_debug.diagnosis.replay import replay_path
    config = {**_state(seed)["model_config"], "embd_pdrop": "x", "summary_type": None, "id2label": 3,
              "initializer_range": -1, "pad_token_id": "x"}
    assert replay_path(_edit(_copy(seed, tmp_path), model_config=config)).first_disagreement is None


@pytest.mark.parametrize("dtype", [torch.int32, torch.float8_e4m3fn])
def test_weights_of_a_dtype_a_replay_does_not_compute_in_or_of_mixed_dtypes_are_refused(seed, dtype):
    """Were copied into the fp32 model silently (load_state_dict casts), or the model cast to the first's dtype."""
    from rookworld_debug.errors import TraceError
    from rookworld_debug.grpo.trace.state import build_model, read_state
    st = read_state(seed)
    for weights in ({k: v.to(dtype) for k, v in st.before.items()},
                    {**st.before, "transformer.ln_f.bias": st.before["transformer.ln_f.bias"].half()}):
        with pytest.raises(TraceError, match="a replay rebuilds a model of one of"):
            build_model(st, weights)


def test_a_state_folder_or_tokenizer_linked_out_of_the_step_is_refused(seed, tmp_path):
    for part in ("state", "state/tokenizer"):
        folder = _copy(seed, tmp_path / part.replace("/", "-"))
        outside = tmp_path / f"outside-{part.replace('/', '-')}"
        (folder / part).rename(outside)
        (folder / part).symlink_to(outside, target_is_directory=True)
        _refused(folder, "link")


@pytest.mark.parametrize("damage, match", [
    (lambda tok: shutil.copy(tok.parent / "state.json", tok / "tokenizer.json"), "unreadable"),   # was a KeyError
    (lambda tok: (tok / "tokenizer.json").unlink(), "has 1 tokens"),    # was an empty tokenizer, EOS id 0
])
def test_a_damaged_tokenizer_is_refused_by_name(seed, tmp_path, damage, match):
    from rookworld_debug.diagnosis.replay import replay_path
    from rookworld_debug.errors import TraceError
    folder = _copy(seed, tmp_path)
    damage(folder / "state" / "tokenizer")
    with pytest.raises(TraceError, match=match):
        replay_path(folder)


@pytest.mark.parametrize("part, value", [("gradient", math.inf), ("gradient", math.nan), ("after", math.inf)])
def test_a_non_finite_gradient_or_step_is_a_disagreement_with_no_fit(seed, tmp_path, part, value):
    """Was torch.linalg.lstsq's internal assert (the fits regressed on inf), or an infinite bound every fit held to."""
    from rookworld_debug.diagnosis.replay import replay_path

    def edit(t):
        t["transformer.h.0.mlp.c_fc.weight"].view(-1)[5] = value
    first = replay_path(_resave(_copy(seed, tmp_path), part, edit)).first_disagreement
    assert first.phase == ("gradient" if part == "gradient" else "update") and first.cause == "", first
    assert "NaN or ±inf" in first.explanation and first.fit is None
    json.dumps(first.to_dict(), allow_nan=False)


def test_a_fit_of_a_nan_residual_is_strict_json():
    from rookworld_debug.diagnosis.replay import PhaseCheck
    c = PhaseCheck("gradient", "q", "disagree", math.inf, 1e-4, fit={"kind": "terms", "residual": math.nan,
                                                                     "params": {"t": [math.inf, 1.0]}})
    assert json.loads(json.dumps(c.to_dict(), allow_nan=False))["fit"]["residual"] == "nan"


def test_the_gradient_regressions_explain_nothing_with_non_finite_or_noise_terms():
    """A NaN term: was lstsq's internal assert. A previous pass's gradient at float noise left out of the fit: was
    a KeyError naming it."""
    from rookworld_debug.diagnosis.replay.terms import GradientFit, _regress
    g = {"w": torch.tensor([1.0, 2.0])}
    assert _regress({"w": torch.tensor([math.nan, 1.0])}, {"t": (g, 1.0)}, ["w"]) == ({}, math.inf)
    fit = GradientFit(None, None, previous=lambda: {"w": torch.zeros(2)})
    assert fit.fit_carried_over(g, g, ["w"]) == ({}, math.inf)


@pytest.mark.parametrize("path, value", [
    (("setup", "batch"), 0.5),                        # was an AttributeError in the replay
    (("update", "grad_cosine"), "pg_kl"),             # was check_kl_dominates' AttributeError (check_failed)
    (("recorded", "recorded"), {"__tuple__": [["batch"]]}),   # was a TypeError (unhashable)
    (("rollout", "num_generations"), 2.0),            # was range()'s TypeError in the replay
    (("rollout", "prompts"), {"__tuple__": [1, 2, 3, 4]}),    # was a TypeError in the grouping check
    (("iterations",), [[1]]),                         # was check_dropout's AttributeError (check_failed)
    (("setup", "batch", "completions"), {"__tuple__": [[" M: a1a2"], " M: a1b2"]}),   # was the reward's TypeError
])
def test_a_trace_field_of_another_type_is_refused_at_load(seed, tmp_path, path, value):
    from rookworld_debug.errors import TraceError
    from rookworld_debug.grpo.step import StepTrace
    folder = _copy(seed, tmp_path)
    d = json.loads((folder / "trace.json").read_text())
    node = d
    for name in path[:-1]:
        node = node["fields"][name]
    node["fields"][path[-1]] = value
    (folder / "trace.json").write_text(json.dumps(d))
    with pytest.raises(TraceError, match=path[-1]):
        StepTrace.load(folder)


def test_rows_longer_than_the_recorded_model_s_positions_are_refused_before_a_forward(seed, tmp_path):
    """Weights and config of a model with 8 positions, consistent in every file: the step's rows are longer, and
    the replay names it before a forward (was an IndexError inside the position embedding)."""
    folder = _copy(seed, tmp_path)

    def shorter(t):
        t.update({k: v[:8].contiguous() for k, v in t.items() if k.endswith("transformer.wpe.weight")})
    for name in _state(folder)["files"]:
        _resave(folder, name, shorter)
    _edit(folder, model_config={**_state(folder)["model_config"], "n_positions": 8})
    _refused(folder, "8 positions", at_read=False)
