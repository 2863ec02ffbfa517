"""The `tensorlift` command of an installed wheel, and `python -m tensorlift`.

Both run the CLI binary the wheel carries (tensorlift/_bin/tensorlift, the same
C++ program as a source build's build/tensorlift), replacing this process, so
that its exit status, signals and output are the binary's own.
"""
import os
import sys


def binary() -> str:
    """The path of the CLI inside this package; FileNotFoundError if the package was built without it."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "tensorlift")
    if not os.access(path, os.X_OK):
        raise FileNotFoundError(
            f"{path} is missing: this tensorlift package was built without its command-line tool "
            "(TENSORLIFT_BUILD_TOOLS=OFF); install the wheel from PyPI or `make wheel`")
    return path


def main() -> None:
    try:
        path = binary()
    except FileNotFoundError as e:
        sys.exit(f"tensorlift: {e}")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(path, ["tensorlift", *sys.argv[1:]])


if __name__ == "__main__":
    main()
