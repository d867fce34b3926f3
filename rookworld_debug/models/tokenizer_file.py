"""A recorded GPT-2 tokenizer read straight from its tokenizer.json with the `tokenizers` library: what a replay asks
of it (decode, the end-of-sequence token and id, the vocabulary size, a copy of its files), the strings transformers'
fast tokenizer gives — it decodes with the same backend call, and skips its space clean-up for BPE — without
importing transformers (a second of a diagnosis).

`read` answers None wherever transformers' own loading could give another tokenizer (another class, no
tokenizer.json, a special token the file lacks, extra files that add tokens); the caller then loads it with
transformers. tests/test_gpt2_torch.py holds both on every id and on random sequences.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Optional

CLASSES = ("GPT2Tokenizer", "GPT2TokenizerFast")          # transformers' GPT-2 tokenizers: byte-level BPE
FILES = ("tokenizer.json", "tokenizer_config.json")
SPECIAL = ("bos_token", "eos_token", "unk_token", "pad_token")
MAX_BYTES = 64 << 20                           # GPT-2's tokenizer.json is 1.4 MB


class FileTokenizer:
    def __init__(self, backend, folder: Path, eos_token: Optional[str]):
        self._backend, self.folder = backend, folder
        self.eos_token = eos_token
        self.eos_token_id = None if eos_token is None else backend.token_to_id(eos_token)

    def __len__(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def save_pretrained(self, folder) -> None:
        """The two files it was read from, copied into `folder` (transformers loads them as it would the originals)."""
        Path(folder).mkdir(parents=True, exist_ok=True)
        for name in FILES:
            shutil.copyfile(self.folder / name, Path(folder) / name)


def read(folder) -> Optional[FileTokenizer]:
    """The tokenizer of `folder`, or None where transformers' loading could differ from reading tokenizer.json."""
    folder = Path(folder)
    names = {p.name for p in folder.iterdir()} if folder.is_dir() else set()
    if names != set(FILES):                   # special_tokens_map.json, added_tokens.json, vocab files: theirs
        return None
    if not all((folder / n).is_file() and not (folder / n).is_symlink() and
               (folder / n).stat().st_size <= MAX_BYTES for n in FILES):
        return None                           # a FIFO would block the read; a link or a huge file is not a save's
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
        from tokenizers import Tokenizer
        backend = Tokenizer.from_file(str(folder / "tokenizer.json"))
    except Exception:  # noqa: BLE001 - any unreadable file: transformers' loading names it
        return None
    if not isinstance(config, dict) or config.get("tokenizer_class") not in CLASSES or \
            type(backend.model).__name__ != "BPE" or set(config) & {"added_tokens_decoder", "extra_special_tokens"}:
        return None
    special = {k: config.get(k) for k in SPECIAL}
    if special["eos_token"] is None:          # transformers' class default would apply
        return None
    if any(v is not None and (not isinstance(v, str) or backend.token_to_id(v) is None) for v in special.values()):
        return None                           # a token transformers would add, or one given as a dict
    return FileTokenizer(backend, folder, special["eos_token"])
