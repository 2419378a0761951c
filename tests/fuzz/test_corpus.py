"""The seeded corpus (fuzz_corpus.py): every case of issue 18 and its class gives a clean
one-line error or a finite answer, each under 10 s, in process through ``perfsim.cli.main``."""

import os
import stat

import pytest

from fuzz_corpus import CLI_CASES
from fuzz_harness import GOOD, record, run_cli
from fuzz_inputs import make_files, profile_files


@pytest.fixture(scope="module")
def named(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz-inputs")
    files = {**make_files(root), **profile_files(root)}
    readonly = root / "readonly"
    readonly.mkdir()
    readonly.chmod(stat.S_IRUSR | stat.S_IXUSR)
    yield files, readonly
    readonly.chmod(stat.S_IRWXU)


def _argv(argv, files, readonly, tmp_path) -> tuple[list[str], list[str]]:
    existing = tmp_path / "existing.out"
    existing.write_text("keep me\n")
    places = {**{k: str(v) for k, v in files.items()}, "tmp": str(tmp_path), "missing": str(tmp_path / "no-such-dir"),
              "readonly": str(readonly), "existing": str(existing), "out": str(tmp_path / "fresh" / "out.file")}
    (tmp_path / "fresh").mkdir()
    tokens = argv.split() if isinstance(argv, str) else list(argv)
    out = [t.format(**places) if "{" in t else t for t in tokens]
    written = [t for t in out if t.startswith(str(tmp_path))]
    return out, written


@pytest.mark.parametrize("surface, argv, expect, mention", CLI_CASES,
                         ids=[f"{c[0]}:{c[1] if isinstance(c[1], str) else ' '.join(c[1])}"[:120] for c in CLI_CASES])
def test_cli_case(named, tmp_path, surface, argv, expect, mention):
    files, readonly = named
    if "{readonly}" in str(argv) and os.geteuid() == 0:
        pytest.skip("root writes into read-only folders; the check cannot fail here")
    argv, written = _argv(argv, files, readonly, tmp_path)
    result = record(surface, run_cli(argv, files=tuple(p for p in written if os.path.isfile(p))))
    assert result.outcome in GOOD, f"{' '.join(argv)}\n{result}"
    if expect == "error":
        assert result.outcome == "error", f"bad input accepted: {' '.join(argv)}\n{result}"
        assert mention.lower() in result.err.lower(), f"error does not name {mention!r}: {result.err.strip()}"
    elif expect == "ok":
        assert result.outcome == "ok", f"{' '.join(argv)}\n{result}"
    if "existing.out" in " ".join(argv) and "--force" not in argv:
        assert (tmp_path / "existing.out").read_text() == "keep me\n", "an existing output was replaced without --force"


def test_the_harness_sees_hangs_tracebacks_and_nan():
    """The classifier can fail: a spin, a stray exception and a NaN answer are each caught."""
    from fuzz_harness import run_api

    def spin():
        while True:
            pass

    assert run_api(spin, limit_s=0.5).outcome == "hang"
    assert run_api(lambda: 1 / 0).outcome == "traceback"
    assert run_api(lambda: {"step_time_s": float("nan")}).outcome == "nonfinite"
    assert run_cli(["simulate", "--model", "llama3.1-8b", "--tp", "0", "--gbs", "8", "--seq", "8"]).outcome == "error"
