"""The package's version, read by the modules that record it (the audit JSON, the compile cache's
keys, `tmplkit --version`) without importing the package root."""

__version__ = "0.2.0"
