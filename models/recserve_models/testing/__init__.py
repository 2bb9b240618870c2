"""Test support, not part of the library API: what the tests of the server and of this toolchain run against.

- `fixture` (the `fixture` command): the small test repository, its rank cases and the expected answers of the
  server's end-to-end tests, byte for byte the same on every run of a seed;
- `fixture_recall`: the fixture's recall and recommend part (two LightGCN models, a DeepFM with an item feature
  table, a pipeline) with exact expected answers;
- `check_cases`: valid and broken repositories that `check` and the server's loader must judge alike
  (`tests/check_parity.rs`);
- `demo_cases` (the `demo-cases` command): held-out rank requests and offline scores for the committed demo
  models (`tests/demo_models.rs`).

These modules are shipped with the package only so that `python -m recserve_models fixture` and `demo-cases` run
from any checkout; their names, files and formats change with the tests that read them, without notice.
"""
