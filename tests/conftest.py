"""Shared test fixtures."""
import os
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

# Under pytest-xdist (scripts/test.sh runs two workers) each worker gets one thread for torch, and so do the
# subprocesses it starts: two workers with two OpenMP threads each would oversubscribe a 2-core machine.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"


# --------------------------------------------------------------------- the default run and the slow set
# `scripts/test.sh` runs `-m "not slow"` (the default run, about 7 minutes on 2 cores); `scripts/test.sh --all`, and
# CI, run the slow set after it. Slow are the tests marked so in their file and every test of the files listed in
# tests/slow_files.txt: whole files, so that a module's fixtures are built in one of the two runs, not in both. The
# list is made from measured times (docs/bench/test-durations-*.md); a line naming no file is an error, not a
# silently shorter slow set.
_REPO = Path(__file__).resolve().parents[1]


def slow_files() -> list[str]:
    """The files tests/slow_files.txt lists (paths from the repository's root), in its order."""
    text = (_REPO / "tests" / "slow_files.txt").read_text()
    return [line.split()[0] for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


@pytest.hookimpl(tryfirst=True)          # before -m deselects by marker
def pytest_collection_modifyitems(config, items):
    slow = set(slow_files())
    missing = sorted(n for n in slow if not (_REPO / n).is_file())
    if missing:
        raise pytest.UsageError(f"tests/slow_files.txt names files that do not exist: {', '.join(missing)}")
    for item in items:
        if item.path.resolve().relative_to(_REPO).as_posix() in slow:
            item.add_marker(pytest.mark.slow)


# --------------------------------------------------------------------- disk: what a module's fixtures wrote
# The suite saves many whole steps (weights, optimizer state, rollouts): kept to the session's end they came to
# ~14 GB and filled a CI machine's disk. A passing test's tmp_path is removed when it ends (pyproject:
# tmp_path_retention_policy = "failed"); the folders a module- or class-scoped fixture made with tmp_path_factory
# are removed when its module ends, unless a test of that module failed (kept to look at, as tmp_path is).
_FIXTURE_SCOPES: list = []      # the scopes of the fixtures being set up now, innermost last
_MODULE_TEMPS: list = []        # folders module- and class-scoped fixtures made, in order


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    _FIXTURE_SCOPES.append(fixturedef.scope)
    yield
    _FIXTURE_SCOPES.pop()


_mktemp = pytest.TempPathFactory.mktemp


def _mktemp_noted(self, basename: str, numbered: bool = True) -> Path:
    path = _mktemp(self, basename, numbered)
    if _FIXTURE_SCOPES and _FIXTURE_SCOPES[-1] in ("module", "class"):
        _MODULE_TEMPS.append(path)
    return path


pytest.TempPathFactory.mktemp = _mktemp_noted


@pytest.fixture(autouse=True, scope="module")
def _module_temps_removed(request):
    import shutil
    start, failed = len(_MODULE_TEMPS), request.session.testsfailed
    yield
    made = _MODULE_TEMPS[start:]
    del _MODULE_TEMPS[start:]
    if request.session.testsfailed == failed:
        for path in made:
            shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread_after_each_module():
    """torch.set_num_threads is per process: a module that raises it (several use 2) would keep it for every later
    module of its xdist worker, and two workers of 2 threads each on 2 cores spend CPU waiting on each other. Under
    xdist each module starts from the one thread set above; a module that wants more still sets it itself."""
    yield
    if os.environ.get("PYTEST_XDIST_WORKER") and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """The real RookWorld fixtures in tests/fixtures/rookworld (their provenance: its README.md)."""
    candidates = [Path(__file__).parent / "fixtures" / "rookworld"]
    if os.environ.get("ROOKWORLD_SHARED"):
        candidates.append(Path(os.environ["ROOKWORLD_SHARED"]) / "fixtures")
    for path in candidates:
        if (path / "rook_p_lines.txt").exists():
            return path
    pytest.skip(f"RookWorld fixtures not found (looked in {', '.join(map(str, candidates))})")


# A machine that lacks some of the test dependencies (a bare GPU machine, scripts/gpu_check.py): a test that stops on
# importing one of the modules named in RW_ABSENT_MODULES is reported as skipped, naming the module. Unset (the
# default, and CI): a missing module is the failure it is.
_ABSENT = set(filter(None, os.environ.get("RW_ABSENT_MODULES", "").split(",")))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    err = call.excinfo.value if call.excinfo is not None else None
    if _ABSENT and rep.failed and isinstance(err, ModuleNotFoundError) and \
            (err.name or "").split(".")[0] in _ABSENT:
        rep.outcome = "skipped"
        rep.longrepr = (str(item.path), item.location[1] or 0, f"needs {err.name}, which this machine lacks")


# tests/tinymodels.py is imported as a plain module by the tests
import sys as _sys

_sys.path.insert(0, str(Path(__file__).parent))


# --------------------------------------------------------------------- fuzz-case counts
_FUZZ_COUNTS = pytest.StashKey[dict]()


@pytest.fixture(scope="session")
def fuzz_counts(request) -> dict:
    """{label: number of generated cases}; tests add to it, the terminal summary prints it."""
    return request.config.stash.setdefault(_FUZZ_COUNTS, {})


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    counts = config.stash.get(_FUZZ_COUNTS, None)
    if counts:
        terminalreporter.write_sep("-", "reliability fuzz cases (hypothesis-generated inputs checked)")
        for label, n in sorted(counts.items()):
            terminalreporter.write_line(f"{label:<58} {n:>8,d}")


# --------------------------------------------------------------------- a tiny byte-level model
@pytest.fixture(scope="session")
def tiny_byte_model_dir(tmp_path_factory) -> Path:
    """A 2-layer GPT-2 with a 257-token byte tokenizer saved as a standard HF folder (fast in CI).
    Its EOS logit is raised (~12 % per token at T=0.5) so rollouts hold ended and truncated rows.
    Pass the folder as `StepConfig(model=str(folder))` or to `load_policy_and_reference(folder)`."""
    from tinymodels import save_tiny_gpt2
    return save_tiny_gpt2(tmp_path_factory.mktemp("tiny_byte_model"), n_positions=256)


# --------------------------------------------------------------------- TRL runs, built once per session
def _built_once(tmp_path_factory, name: str, build) -> Path:
    """The folder `build(folder)` makes, made once per test session. Under pytest-xdist the workers share one build
    (a file lock in the session's temporary root; a marker file says the build finished)."""
    import shutil

    from filelock import FileLock
    root = tmp_path_factory.getbasetemp()
    root = root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root   # xdist: the folder all workers share
    folder = root / f"{name}-shared"
    with FileLock(str(root / f"{name}-shared.lock")):
        if not (folder / ".built").is_file():
            shutil.rmtree(folder, ignore_errors=True)                   # a build that failed half-way
            folder.mkdir(parents=True)
            build(folder)
            (folder / ".built").touch()
    return folder


@pytest.fixture(scope="session")
def trl_demo_run(tmp_path_factory) -> Path:
    """`rookworld-debug trl-demo` on its defaults (TRL's GRPOTrainer on the tiny model, 12 steps, the metrics jump
    at step 8, flight recorder on), run once per test session as a user runs it. Read-only: copy it
    (`shutil.copytree`) before writing into it."""
    from cli import run_cli

    def build(folder):
        r = run_cli("trl-demo", "--out", folder / "trl-demo", cwd=folder)
        assert r.returncode == 0, r.stderr[-3000:]
    return _built_once(tmp_path_factory, "trl-demo", build) / "trl-demo"


@pytest.fixture(scope="session")
def trl_checkpointed_run(tmp_path_factory) -> Path:
    """A 3-step TRL GRPOTrainer run of the tiny model (`trl.example.make_trainer`) with a checkpoint after every step
    (`run/checkpoint-N`) and steps 2 and 3 captured (`captures/step-00000N`), made once per test session. Read-only.
    The tests that use it run torch on one thread."""
    import torch
    torch.set_num_threads(1)

    def build(folder):
        from rookworld_debug.trl.capture import capture_steps
        from rookworld_debug.trl.example import make_trainer
        os.environ["HF_HUB_OFFLINE"] = "1"
        trainer = make_trainer(folder / "run", max_steps=3, save_steps=1, save_strategy="steps",
                               max_completion_length=48)             # short budget: fast (mechanics only)
        cap = capture_steps(trainer, steps=[2, 3], out_dir=folder / "captures")
        trainer.train()
        assert cap.errors == {} and sorted(cap.paths) == [2, 3]
    return _built_once(tmp_path_factory, "trl-checkpointed", build)


# --------------------------------------------------------------------- offline browser pages
@contextmanager
def offline_page(path: Path, blocked: list | None = None):
    """Debian's Chromium, headless, with `path` loaded offline (requests other than file:// are aborted and listed
    in `blocked`); yields the page. Skips where Playwright or /usr/bin/chromium is missing."""
    sync_api = pytest.importorskip("playwright.sync_api")
    if not Path("/usr/bin/chromium").exists():
        pytest.skip("no /usr/bin/chromium (scripts/setup.sh --browser installs it)")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                                    args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            block_network(page, [] if blocked is None else blocked)
            page.goto(path.as_uri())
            yield page
        finally:
            browser.close()


def block_network(page, blocked: list) -> None:
    """Let a Playwright page load file:// URLs only; every other request is aborted and listed in `blocked`
    (an offline report must not fetch anything)."""
    def route(r):
        if r.request.url.startswith("file://"):
            r.continue_()
        else:
            blocked.append(r.request.url)
            r.abort()
    page.route("**/*", route)


@pytest.fixture
def registry_restored():
    """The objective-family registry and the settings it registered, restored after the test (both are
    process-wide): a family registered in a test does not outlive it."""
    from rookworld_debug.grpo.registry import registered_for_now
    with registered_for_now():
        yield
