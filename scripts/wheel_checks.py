"""What a user of the installed wheel sees, checked from inside the virtualenv it went into.

Run by scripts/test-wheel.sh with the venv's python, in an environment whose PATH is the
venv's bin/ (and the servers the tests start): no cargo, rustc, protoc or C compiler.
Exits non-zero, saying what differs, at the first check that fails.

    python wheel_checks.py basic VERSION              import, version, `python -m rdzv`
    python wheel_checks.py user VERSION LICENSE REPOSITORY
                                                      the above, the metadata, the binary on
                                                      PATH, `rdzv demo`, exit codes; no torch
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from importlib.metadata import distribution
from pathlib import Path


def run(*cmd: str, expect: int = 0, timeout: float = 120) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == expect, f"{' '.join(cmd)} exited {p.returncode}, expected {expect}:\n{p.stdout}\n{p.stderr}"
    return p.stdout + p.stderr


def check_basic(version: str) -> None:
    import rdzv

    venv = Path(sys.prefix).resolve()
    assert Path(rdzv.__file__).resolve().is_relative_to(venv), f"rdzv imported from {rdzv.__file__}, not {venv}"
    assert rdzv.__version__ == version, f"rdzv.__version__ is {rdzv.__version__!r}, the workspace's {version!r}"
    assert distribution("rdzv").version == version, f"installed as {distribution('rdzv').version}"
    assert "torch" not in sys.modules, "`import rdzv` imported torch"
    out = run(sys.executable, "-m", "rdzv", "--version")
    assert out.strip() == f"rdzv {version}", f"`python -m rdzv --version` printed {out!r}"


def check_user(version: str, license: str, repository: str) -> None:
    for tool in ("cargo", "rustc", "protoc", "cc", "gcc"):
        assert shutil.which(tool) is None, f"`{tool}` is on PATH ({shutil.which(tool)}): the check must run without it"
    assert importlib.util.find_spec("torch") is None, "this venv has torch; the check is of rdzv without it"
    check_basic(version)

    meta = distribution("rdzv").metadata
    assert meta["Requires-Python"] == ">=3.9", meta["Requires-Python"]
    assert meta["License-Expression"] == license, f"{meta['License-Expression']!r} != workspace's {license!r}"
    shipped = sorted(meta.get_all("License-File") or [])
    assert shipped == ["LICENSE-APACHE", "LICENSE-MIT"], f"license files in the metadata: {shipped}"
    texts = [f for f in distribution("rdzv").files or [] if f.name in ("LICENSE-MIT", "LICENSE-APACHE")]
    assert len(texts) == 2 and all("license" in f.read_text().lower() for f in texts), f"license texts: {texts}"
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL") or [])
    assert {"Repository", "Documentation", "Issues"} <= set(urls), f"project URLs: {urls}"
    bad = {k: u for k, u in urls.items() if not u.startswith(repository)}
    assert not bad, f"project URLs not under the workspace's repository {repository}: {bad}"
    assert meta.get_all("Provides-Extra") == ["torch"], meta.get_all("Provides-Extra")
    requires = meta.get_all("Requires-Dist") or []
    assert all("extra == 'torch'" in r for r in requires), f"rdzv needs something without the extra: {requires}"
    assert any(r.startswith("torch") for r in requires), requires
    classifiers = meta.get_all("Classifier") or []
    for c in ("Programming Language :: Python :: 3", "Operating System :: POSIX :: Linux", "Typing :: Typed"):
        assert c in classifiers, f"missing classifier {c!r}: {classifiers}"
    assert meta["Description-Content-Type"].startswith("text/markdown"), meta["Description-Content-Type"]
    description = meta.get_payload() or ""
    assert description.startswith("# rdzv for Python") and "pip install rdzv" in description, description[:200]

    # The binary itself on PATH (as `cargo install` gives it), not a Python launcher.
    binary = Path(shutil.which("rdzv") or "")
    assert binary.parent.resolve() == (Path(sys.prefix) / "bin").resolve(), f"`rdzv` on PATH is {binary}, not this venv's"
    assert binary.read_bytes()[:4] == b"\x7fELF", f"{binary} is not the native binary"
    from rdzv.__main__ import find_rdzv_bin

    assert find_rdzv_bin() == binary.resolve(), f"python -m rdzv would run {find_rdzv_bin()}, not {binary}"
    assert run("rdzv", "--version").strip() == f"rdzv {version}"

    # The README's demo: a round, a death, the next round.
    demo = run("rdzv", "demo", timeout=60)
    rounds = re.findall(r"^round [0-9]+:", demo, flags=re.M)
    assert len(rounds) >= 2, f"`rdzv demo` showed {len(rounds)} completed round(s), expected 2:\n{demo}"

    # `python -m rdzv` is the same program: same help, same exit codes and messages.
    assert run(sys.executable, "-m", "rdzv", "--help") == run("rdzv", "--help")
    for command in ("run", "join", "status", "close", "bench", "demo"):
        assert run(sys.executable, "-m", "rdzv", command, "--help") == run("rdzv", command, "--help")
    bad_url = ("join", "nope://host/job")
    assert run(sys.executable, "-m", "rdzv", *bad_url, expect=2) == run("rdzv", *bad_url, expect=2)
    assert "unknown URL scheme" in run("rdzv", *bad_url, expect=2)
    # Without the binary (a build from source), `python -m rdzv` says what to do.
    os.rename(binary, binary.with_name("rdzv.hidden"))
    try:
        p = subprocess.run([sys.executable, "-m", "rdzv", "--help"], capture_output=True, text=True)
    finally:
        os.rename(binary.with_name("rdzv.hidden"), binary)
    assert p.returncode == 1 and "cargo install --path crates/rdzv-cli" in p.stderr, (p.returncode, p.stderr)


def main() -> None:
    what, args = sys.argv[1], sys.argv[2:]
    {"basic": check_basic, "user": check_user}[what](*args)
    print(f"wheel-checks: {what}: Python {sys.version.split()[0]} in {sys.prefix}: every check passed", file=sys.stderr)


if __name__ == "__main__":
    main()
