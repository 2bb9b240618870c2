//! Test support, not part of the server: fixtures that tests and benchmarks build (tables, a small DeepFM
//! contract) and the fuzz harness. Compiled for this crate's tests and, through the `testing` feature, for the
//! tests and benchmarks of the crates above it.

pub mod fuzz;
pub mod tables;

/// The small DeepFM contract the transports' decoding tests share.
pub mod test_contract {
    use std::sync::Arc;

    use crate::ranking::RankContract;
    use crate::repository::ModelSpec;

    /// Fields in model.toml order: u (user, reject, 10 rows), item (item, default), cat (item, reject, 5 rows).
    pub const SPEC: &str = r#"
format_version = 1
kind = "deepfm"
[ranking]
dense_features = ["d0", "d1"]
item_id_field = "item"
[dense_graph]
file = "g.onnx"
precision = "fp32"
output = "ctr"
[[tables]]
name = "u"
file = "t.safetensors"
rows = 10
dim = 3
storage = "fp32"
oov = "reject"
[[tables]]
name = "item"
file = "t.safetensors"
rows = 100
dim = 3
storage = "fp32"
[[tables]]
name = "cat"
file = "t.safetensors"
rows = 5
dim = 3
storage = "fp32"
oov = "reject"
[[fields]]
name = "u"
side = "user"
[[fields]]
name = "item"
side = "item"
[[fields]]
name = "cat"
side = "item"
"#;

    pub fn contract() -> RankContract {
        RankContract::new(Arc::new(ModelSpec::parse(SPEC).expect("spec")), 3)
    }

    /// A wider contract, for comparisons with the reference decoder and for the columnar form's column order:
    /// three user fields (one table rejects unknown ids), four item fields besides the item id (one rejects), three
    /// dense features, user and item fields interleaved in model.toml order.
    pub const WIDE_SPEC: &str = r#"
format_version = 1
kind = "deepfm"
[ranking]
dense_features = ["d0", "d1", "d2"]
item_id_field = "item"
[dense_graph]
file = "g.onnx"
precision = "fp32"
[[tables]]
name = "strict"
file = "t.safetensors"
rows = 50
dim = 2
storage = "fp32"
oov = "reject"
[[tables]]
name = "open"
file = "t.safetensors"
rows = 1000
dim = 2
storage = "fp32"
[[fields]]
name = "u0"
side = "user"
table = "strict"
[[fields]]
name = "i0"
side = "item"
table = "open"
[[fields]]
name = "u1"
side = "user"
table = "open"
[[fields]]
name = "item"
side = "item"
table = "open"
[[fields]]
name = "i1"
side = "item"
table = "strict"
[[fields]]
name = "u2"
side = "user"
table = "open"
[[fields]]
name = "i2"
side = "item"
table = "open"
[[fields]]
name = "i3"
side = "item"
table = "open"
"#;

    /// [`WIDE_SPEC`]'s contract, with at most 40 candidates.
    pub fn wide_contract() -> RankContract {
        RankContract::new(Arc::new(ModelSpec::parse(WIDE_SPEC).expect("spec")), 40)
    }

    /// [`SPEC`] with two candidate features after its dense features: `recall_score`, `recall_rank`.
    pub fn featured_contract() -> RankContract {
        let spec = SPEC.replace(
            "dense_features = [\"d0\", \"d1\"]",
            "dense_features = [\"d0\", \"d1\"]\ncandidate_features = [\"recall_score\", \"recall_rank\"]",
        );
        RankContract::new(Arc::new(ModelSpec::parse(&spec).expect("spec")), 3)
    }
}
