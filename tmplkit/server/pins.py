"""The llama-cpp-python releases tmplkit builds llama-server from, each pinned by the sha256 of its
sdist on PyPI (checked by scripts/build_llama_server.sh before it extracts anything).

The default is the release tmplkit runs on (`corpus.LLAMA_CPP_PYTHON_VERSION`); 0.3.33 is kept as
the last release whose server ends a prompt batch before every user-message start (llama.cpp
issue 25213, PR 24176), so that its logs can be compared with the fixed server's (PR 25420).

    >>> sorted(LLAMA_SERVER_PINS)
    ['0.3.33', '0.3.36']
"""

from __future__ import annotations

from ..errors import InputError
from ..sources.corpus import LLAMA_CPP_PYTHON_SHA256, LLAMA_CPP_PYTHON_VERSION

__all__ = ["LLAMA_SERVER_PINS", "server_pin"]

# version -> sha256 of llama_cpp_python-<version>.tar.gz, as PyPI's simple index lists it.
LLAMA_SERVER_PINS: dict[str, str] = {
    LLAMA_CPP_PYTHON_VERSION: LLAMA_CPP_PYTHON_SHA256,
    "0.3.33": "369ba03d02caaef42c1ed07bbdc454f7436e47c7675b8b9757fa13fbac6acd92",
}


def server_pin(version: str | None = None) -> tuple[str, str]:
    """(version, sha256) of a pinned release; None: the default one. Raises InputError for others."""
    version = version or LLAMA_CPP_PYTHON_VERSION
    if version not in LLAMA_SERVER_PINS:
        raise InputError(f"llama-cpp-python {version} is not pinned for llama-server builds; pinned: "
                         f"{', '.join(sorted(LLAMA_SERVER_PINS))} (add its sdist's sha256 to tmplkit/server/pins.py)")
    return version, LLAMA_SERVER_PINS[version]
