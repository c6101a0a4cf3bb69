"""packtool's version, in a module of its own so that any module can import it without the package's API."""

__version__ = "0.1.0"
