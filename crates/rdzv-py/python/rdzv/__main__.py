"""``python -m rdzv ARGS``: runs the ``rdzv`` command line installed with this package.

The wheel ships the ``rdzv`` binary (the same one ``cargo install --path crates/rdzv-cli``
builds) as a script of the distribution, which pip puts on the environment's ``PATH``
(``<venv>/bin/rdzv``). This module finds that binary and replaces the Python process with
it, so its exit code, signals and process id are the binary's own. A package built from
source (``pip install ./crates/rdzv-py``) has the Python module only, and no binary.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from importlib.metadata import distributions
from pathlib import Path

BINARY = "rdzv"


def _recorded() -> list[Path]:
    """Where the installer put this distribution's ``rdzv`` script, from its RECORD.

    Only the distribution installed beside this very package is asked (another ``rdzv``
    further down ``sys.path`` may be another version), and every install scheme (a venv,
    ``--user``, ``--prefix``, ``--target``) records its own paths there."""
    site_dir = Path(__file__).resolve().parent.parent
    found = []
    for dist in distributions(path=[str(site_dir)]):
        if (dist.metadata["Name"] or "").lower() != "rdzv":
            continue
        for file in dist.files or []:
            if file.name == BINARY and file.parent.name in ("bin", "scripts", "Scripts"):
                found.append(Path(dist.locate_file(file)).resolve())
    return found


def _scripts_dirs() -> list[Path]:
    """The script directories of this interpreter's install schemes (when RECORD is gone)."""
    dirs = [sysconfig.get_path("scripts")]
    user_scheme = f"{os.name}_user"
    if user_scheme in sysconfig.get_scheme_names():
        dirs.append(sysconfig.get_path("scripts", scheme=user_scheme))
    return [Path(d) / BINARY for d in dirs]


def find_rdzv_bin() -> Path:
    """The path of the ``rdzv`` binary installed with this package.

    Raises ``FileNotFoundError`` naming every place looked at when there is none."""
    candidates = _recorded() + _scripts_dirs()
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    looked = "\n  ".join(str(p) for p in dict.fromkeys(candidates))
    raise FileNotFoundError(
        f"this install of the rdzv package has no `{BINARY}` binary; looked at:\n  {looked}\n"
        "The wheels ship it; a build from source (`pip install ./crates/rdzv-py` or the sdist) "
        "has the Python module only. Install a wheel, or the command line itself with "
        "`cargo install --path crates/rdzv-cli`."
    )


def main() -> None:
    try:
        binary = find_rdzv_bin()
    except FileNotFoundError as e:
        print(f"python -m rdzv: {e}", file=sys.stderr)
        sys.exit(1)
    # argv[0] is the binary's own path, as when it is run from PATH (its --help names it).
    os.execv(binary, [str(binary), *sys.argv[1:]])


if __name__ == "__main__":
    main()
