"""recserve_models: the model toolchain of recserve.

It writes model repositories in the format of docs/model-repository.md (embedding tables in safetensors,
the dense network in ONNX, `model.toml`), quantizes them, and generates the test repository that the server's
end-to-end tests run against. Run it as `python -m recserve_models <command>`.

The modules directly in this package are the library; `commands/` holds the command line (one module per
command), and `testing/` the test support (fixtures and parity cases), which is not part of the library API.
"""

__version__ = "0.1.0"  # the workspace version of Cargo.toml (tests/test_cli.py compares them); pyproject.toml reads it
