"""The package version, in a leaf module: the files that record it (checkpoint descriptions,
AscendV1 descriptions) read it here, never through the package root."""

__version__ = "0.1.0"
