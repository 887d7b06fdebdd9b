"""Execute a notebook top to bottom with nbclient; a cell that raises fails the run.

    ./dev.sh notebook                                                   # the tour, in the project's venv
    python notebooks/execute.py notebooks/fxflash_tour.ipynb            # check only (nbclient installed)
    python notebooks/execute.py notebooks/fxflash_tour.ipynb --write    # keep the outputs

The kernel is this Python's (ipykernel); cells run with the notebook's folder as the working
directory.
"""
from __future__ import annotations

import argparse
import os
import sys
import time


def execute(path: str, timeout: int = 900):
    import nbclient
    import nbformat

    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                                     resources={"metadata": {"path": os.path.dirname(os.path.abspath(path))}})
    client.execute()
    return notebook


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook")
    parser.add_argument("--write", action="store_true", help="save the executed notebook in place")
    opts = parser.parse_args(argv)
    try:
        import nbclient  # noqa: F401
    except ImportError:
        print("execute.py needs nbclient: run ./dev.sh notebook, or pip install -e \".[notebook]\" first",
              file=sys.stderr)
        return 2
    start = time.perf_counter()
    notebook = execute(opts.notebook)
    print(f"{opts.notebook}: executed in {time.perf_counter() - start:.0f} s")
    if opts.write:
        import nbformat

        nbformat.write(notebook, opts.notebook)
    return 0


if __name__ == "__main__":
    sys.exit(main())
