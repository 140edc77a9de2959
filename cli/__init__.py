"""The ``nslab`` command line: one module per subcommand."""
from importlib import metadata


def version() -> str:
    """The installed distribution's version (``pyproject.toml``)."""
    try:
        return metadata.version("nslab")
    except metadata.PackageNotFoundError:   # the sources on sys.path, not installed
        return "unknown (not installed)"
