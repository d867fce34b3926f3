"""Named errors. Every bad input surfaces as one of these (or as a flagged record), never as a bare
traceback from deep inside python-chess/torch or as a silently wrong number."""


__all__ = ["RookWorldError", "FormatError", "IllegalMoveError", "EngineNotFound", "EngineError", "ModelLoadError",
           "ConfigError", "DataError", "NumericalError", "TraceError", "IncompatibleTraceError", "CheckpointError",
           "DeviceMemoryError", "SaveError", "NoWeightsError"]

class RookWorldError(Exception):
    """Base class of every error raised on purpose by rookworld_debug."""


class FormatError(RookWorldError, ValueError):
    """A P:/A: string (prompt, completion, FEN, UCI move) does not follow the RookWorld layout."""


class IllegalMoveError(RookWorldError, ValueError):
    """A move is well-formed UCI but illegal in the given position."""


class EngineNotFound(RookWorldError, FileNotFoundError):
    """No Stockfish binary was found."""

    HINT = ("Install it with `apt-get install -y stockfish` (Debian puts it at /usr/games/stockfish, "
            "which is not on PATH), `brew install stockfish`, or pass its path explicitly; "
            "or use reward_mode='dataset' which needs no engine.")

    def __init__(self, searched):
        self.searched = list(searched)
        super().__init__(f"Stockfish not found (searched: {', '.join(map(str, self.searched))}). {self.HINT}")


class EngineError(RookWorldError, RuntimeError):
    """The engine process failed in a way a restart did not fix."""


class ModelLoadError(RookWorldError, OSError):
    """A model or tokenizer could not be loaded (e.g. an HF id while offline)."""


class ConfigError(RookWorldError, ValueError):
    """A configuration value is impossible; the message names the field."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field}: {message}")


class DataError(RookWorldError, ValueError):
    """A dataset file or selection is unusable (missing, empty, wrong task type...)."""


class NumericalError(RookWorldError, FloatingPointError):
    """A NaN/inf would have flowed into a loss or an optimizer step; the step refuses instead."""


class TraceError(RookWorldError, ValueError):
    """A folder given as a step trace / TRL capture is not one (no or unreadable trace.json/.safetensors)."""


class IncompatibleTraceError(TraceError):
    """A trace or TRL capture was written by a version (TRL, capture format) this package cannot read."""


class NoWeightsError(TraceError):
    """A recorded step keeps no weights before and after its update, gradient or optimizer state, and a question
    needs them (what a fix changes in the step's update); the message says which are missing."""


class CheckpointError(ModelLoadError):
    """A checkpoint/cache file (policy.pt, optimizer.pt, rng.pt) is missing, damaged, of another model, or
    holds something other than tensors and plain values (it is never unpickled)."""


class SaveError(RookWorldError, OSError):
    """A step folder could not be written (a full disk, a file size limit, a file where a folder should be); the
    message names the folder, `errno` the cause. Whatever was saved there before is left whole."""


class DeviceMemoryError(RookWorldError, MemoryError):
    """The device ran out of memory in a named phase; the message says which setting would fit."""

    def __init__(self, phase: str, advice: str, detail: str = ""):
        self.phase, self.advice = phase, advice
        first = (detail.strip().splitlines() or [""])[0][:160]
        super().__init__(f"out of device memory in the {phase} phase{f' ({first})' if first else ''}: {advice}")
