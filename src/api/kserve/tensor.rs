//! Tensors of the Open Inference Protocol, independent of the transport: the datatypes, an input tensor as a
//! transport decoded it (JSON values, little-endian bytes, or typed gRPC contents), and an output tensor. Reading
//! an input checks its shape against its data and names the tensor in every error.

use axum::body::Bytes;
use serde_json::Value;

use recserve_core::error::ServiceError;

/// The tensor datatypes of the protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Datatype {
    Bool,
    Uint8,
    Uint16,
    Uint32,
    Uint64,
    Int8,
    Int16,
    Int32,
    Int64,
    Fp16,
    Bf16,
    Fp32,
    Fp64,
    Bytes,
}

impl Datatype {
    const ALL: [Datatype; 14] = [
        Datatype::Bool,
        Datatype::Uint8,
        Datatype::Uint16,
        Datatype::Uint32,
        Datatype::Uint64,
        Datatype::Int8,
        Datatype::Int16,
        Datatype::Int32,
        Datatype::Int64,
        Datatype::Fp16,
        Datatype::Bf16,
        Datatype::Fp32,
        Datatype::Fp64,
        Datatype::Bytes,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Datatype::Bool => "BOOL",
            Datatype::Uint8 => "UINT8",
            Datatype::Uint16 => "UINT16",
            Datatype::Uint32 => "UINT32",
            Datatype::Uint64 => "UINT64",
            Datatype::Int8 => "INT8",
            Datatype::Int16 => "INT16",
            Datatype::Int32 => "INT32",
            Datatype::Int64 => "INT64",
            Datatype::Fp16 => "FP16",
            Datatype::Bf16 => "BF16",
            Datatype::Fp32 => "FP32",
            Datatype::Fp64 => "FP64",
            Datatype::Bytes => "BYTES",
        }
    }

    /// The datatype named `name` (case-sensitive, as the protocol's strings are).
    pub(crate) fn parse(name: &str) -> Option<Datatype> {
        Datatype::ALL.into_iter().find(|d| d.as_str() == name)
    }

    /// Bytes per element in binary form; `None` for BYTES, whose elements carry their own length.
    pub(crate) fn element_size(self) -> Option<usize> {
        match self {
            Datatype::Bool | Datatype::Uint8 | Datatype::Int8 => Some(1),
            Datatype::Uint16 | Datatype::Int16 | Datatype::Fp16 | Datatype::Bf16 => Some(2),
            Datatype::Uint32 | Datatype::Int32 | Datatype::Fp32 => Some(4),
            Datatype::Uint64 | Datatype::Int64 | Datatype::Fp64 => Some(8),
            Datatype::Bytes => None,
        }
    }
}

/// Typed values of a gRPC `InferTensorContents`: the one repeated field a tensor filled.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Typed {
    Bool(Vec<bool>),
    Int(Vec<i32>),
    Int64(Vec<i64>),
    Uint(Vec<u32>),
    Uint64(Vec<u64>),
    Fp32(Vec<f32>),
    Fp64(Vec<f64>),
    Bytes(Vec<Vec<u8>>),
}

impl Typed {
    /// The field of `InferTensorContents` these values came from.
    pub(crate) fn field(&self) -> &'static str {
        match self {
            Typed::Bool(_) => "bool_contents",
            Typed::Int(_) => "int_contents",
            Typed::Int64(_) => "int64_contents",
            Typed::Uint(_) => "uint_contents",
            Typed::Uint64(_) => "uint64_contents",
            Typed::Fp32(_) => "fp32_contents",
            Typed::Fp64(_) => "fp64_contents",
            Typed::Bytes(_) => "bytes_contents",
        }
    }
}

/// The data of an input tensor, in the form its transport carried it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum TensorData {
    /// JSON `data`: a flat or nested array of values, row-major.
    Json(Value),
    /// Little-endian, row-major bytes without padding (HTTP binary extension, gRPC `raw_input_contents`).
    Raw(Bytes),
    /// gRPC typed `contents`.
    Typed(Typed),
}

/// An input tensor as a transport decoded it; nothing is checked yet.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct InputTensor {
    pub(crate) name: String,
    /// As sent: checked against the model's contract, so a wrong name can be reported as sent.
    pub(crate) datatype: String,
    pub(crate) shape: Vec<i64>,
    pub(crate) data: TensorData,
}

impl InputTensor {
    fn invalid(&self, problem: impl Into<String>) -> ServiceError {
        ServiceError::invalid(&self.name, problem)
    }

    /// Checks the datatype against the one the model takes.
    pub(crate) fn expect_datatype(&self, expected: Datatype) -> Result<(), ServiceError> {
        match Datatype::parse(&self.datatype) {
            Some(d) if d == expected => Ok(()),
            Some(d) => Err(self.invalid(format!(
                "datatype {}, but the model takes {}",
                d.as_str(),
                expected.as_str()
            ))),
            None => Err(self.invalid(format!(
                "datatype {:?} is not a datatype of the protocol (the model takes {})",
                self.datatype,
                expected.as_str()
            ))),
        }
    }

    /// The number of elements the shape declares.
    pub(crate) fn element_count(&self) -> Result<usize, ServiceError> {
        let mut count: usize = 1;
        for &dim in &self.shape {
            let dim = usize::try_from(dim).map_err(|_| {
                self.invalid(format!("shape {:?} has a negative dimension", self.shape))
            })?;
            count = count.checked_mul(dim).ok_or_else(|| {
                self.invalid(format!("shape {:?} holds too many elements", self.shape))
            })?;
        }
        Ok(count)
    }

    fn count_mismatch(&self, given: usize, count: usize) -> ServiceError {
        self.invalid(format!(
            "shape {:?} holds {count} elements, but the data holds {given}",
            self.shape
        ))
    }

    fn raw_len(&self, bytes: &Bytes, datatype: Datatype, count: usize) -> Result<(), ServiceError> {
        let size = datatype.element_size().unwrap_or(1);
        let expected = count.saturating_mul(size);
        if bytes.len() == expected {
            Ok(())
        } else {
            Err(self.invalid(format!(
                "holds {} bytes of binary data, but shape {:?} of {} needs {expected} ({count} elements × {size} bytes)",
                bytes.len(),
                self.shape,
                datatype.as_str()
            )))
        }
    }

    /// The values of JSON `data`, row-major. Flat data (an array of values; a lone value is one element) may
    /// hold the shape's elements in any nesting of the shape's; nested data must follow the shape exactly: each
    /// array as long as its dimension, values only at the innermost level.
    fn leaves<'a>(&self, data: &'a Value) -> Result<Vec<&'a Value>, ServiceError> {
        match data {
            Value::Array(items) if items.iter().any(Value::is_array) => {
                let mut out = Vec::new();
                self.nested(data, 0, &mut "data".to_owned(), &mut out)?;
                Ok(out)
            }
            Value::Array(items) => Ok(items.iter().collect()),
            value => Ok(vec![value]),
        }
    }

    /// Reads `value`, the part of nested data at `path`, `depth` dimensions down the shape.
    fn nested<'a>(
        &self,
        value: &'a Value,
        depth: usize,
        path: &mut String,
        out: &mut Vec<&'a Value>,
    ) -> Result<(), ServiceError> {
        let dims = self.shape.len();
        let follow = "send data flat, or nested exactly as the shape";
        match (value, self.shape.get(depth)) {
            (Value::Array(items), Some(&dim)) => {
                if usize::try_from(dim) != Ok(items.len()) {
                    return Err(self.invalid(format!(
                        "{path} holds {} elements, but dimension {depth} of shape {:?} is {dim}: {follow}",
                        items.len(),
                        self.shape
                    )));
                }
                for (i, item) in items.iter().enumerate() {
                    let len = path.len();
                    path.push_str(&format!("[{i}]"));
                    self.nested(item, depth + 1, path, out)?;
                    path.truncate(len);
                }
                Ok(())
            }
            (Value::Array(_), None) => Err(self.invalid(format!(
                "{path} is an array, but shape {:?} has {dims} dimensions: {follow}",
                self.shape
            ))),
            (leaf, None) => {
                out.push(leaf);
                Ok(())
            }
            (leaf, Some(_)) => Err(self.invalid(format!(
                "{path} is {leaf}, where shape {:?} nests {dims} levels of arrays: {follow}",
                self.shape
            ))),
        }
    }

    fn typed_mismatch(&self, typed: &Typed, datatype: Datatype, field: &str) -> ServiceError {
        self.invalid(format!(
            "contents: {} data goes in {field}, but the tensor filled {}",
            datatype.as_str(),
            typed.field()
        ))
    }

    /// The tensor's values as INT64 (call [`InputTensor::expect_datatype`] first), row-major; their number must be
    /// what the shape declares.
    pub(crate) fn into_i64(self) -> Result<Vec<i64>, ServiceError> {
        self.into_values(Element {
            datatype: Datatype::Int64,
            field: "int64_contents",
            from_le: i64::from_le_bytes,
            from_json: Value::as_i64,
            typed: |t| match t {
                Typed::Int64(values) => Ok(values),
                other => Err(other),
            },
        })
    }

    /// The tensor's values as INT32 (call [`InputTensor::expect_datatype`] first), row-major; their number must be
    /// what the shape declares.
    pub(crate) fn into_i32(self) -> Result<Vec<i32>, ServiceError> {
        self.into_values(Element {
            datatype: Datatype::Int32,
            field: "int_contents",
            from_le: i32::from_le_bytes,
            from_json: |v| v.as_i64().and_then(|x| i32::try_from(x).ok()),
            typed: |t| match t {
                Typed::Int(values) => Ok(values),
                other => Err(other),
            },
        })
    }

    /// The tensor's values as FP32 (call [`InputTensor::expect_datatype`] first), row-major; their number must be
    /// what the shape declares. JSON numbers are rounded to the nearest `f32` (out of range: ±inf).
    pub(crate) fn into_f32(self) -> Result<Vec<f32>, ServiceError> {
        self.into_values(Element {
            datatype: Datatype::Fp32,
            field: "fp32_contents",
            from_le: f32::from_le_bytes,
            from_json: |v| v.as_f64().map(|x| x as f32),
            typed: |t| match t {
                Typed::Fp32(values) => Ok(values),
                other => Err(other),
            },
        })
    }

    fn into_values<T, const N: usize>(mut self, e: Element<T, N>) -> Result<Vec<T>, ServiceError> {
        let count = self.element_count()?;
        match std::mem::replace(&mut self.data, TensorData::Json(Value::Null)) {
            TensorData::Raw(bytes) => {
                self.raw_len(&bytes, e.datatype, count)?;
                Ok(le_values(&bytes, e.from_le))
            }
            TensorData::Json(value) => {
                let values = self.leaves(&value)?;
                if values.len() != count {
                    return Err(self.count_mismatch(values.len(), count));
                }
                values
                    .iter()
                    .enumerate()
                    .map(|(i, v)| {
                        (e.from_json)(v).ok_or_else(|| {
                            let datatype = e.datatype.as_str();
                            // JSON reads an integer beyond 64 bits as a float: say that it is out of range,
                            // not that it is not an integer.
                            let beyond = e.datatype == Datatype::Int64
                                && v.as_f64().is_some_and(|x| x.fract() == 0.0);
                            self.invalid(if beyond {
                                format!(
                                    "data[{i}] is {v}, an integer beyond the range of {datatype} ({} to {})",
                                    i64::MIN,
                                    i64::MAX
                                )
                            } else {
                                format!("data[{i}] is {v}, which is not an {datatype} value")
                            })
                        })
                    })
                    .collect()
            }
            TensorData::Typed(typed) => match (e.typed)(typed) {
                Ok(values) if values.len() == count => Ok(values),
                Ok(values) => Err(self.count_mismatch(values.len(), count)),
                Err(other) => Err(self.typed_mismatch(&other, e.datatype, e.field)),
            },
        }
    }
}

/// How values of one element type are read from each form of tensor data.
struct Element<T, const N: usize> {
    datatype: Datatype,
    /// The field of `InferTensorContents` that holds this type.
    field: &'static str,
    from_le: fn([u8; N]) -> T,
    from_json: fn(&Value) -> Option<T>,
    /// The values when the typed contents are of this type, else the contents back.
    typed: fn(Typed) -> Result<Vec<T>, Typed>,
}

/// Decodes little-endian values; `bytes.len()` is a multiple of `N` (checked by the caller).
fn le_values<T, const N: usize>(bytes: &[u8], from: fn([u8; N]) -> T) -> Vec<T> {
    bytes
        .chunks_exact(N)
        .map(|chunk| {
            let mut array = [0u8; N];
            array.copy_from_slice(chunk);
            from(array)
        })
        .collect()
}

/// The values of an output tensor.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum OutputData {
    Int64(Vec<i64>),
    Fp32(Vec<f32>),
}

impl OutputData {
    pub(crate) fn datatype(&self) -> Datatype {
        match self {
            OutputData::Int64(_) => Datatype::Int64,
            OutputData::Fp32(_) => Datatype::Fp32,
        }
    }

    /// Little-endian, row-major bytes: the binary form of the tensor.
    pub(crate) fn to_le_bytes(&self) -> Vec<u8> {
        match self {
            OutputData::Int64(values) => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            OutputData::Fp32(values) => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }
}

/// An output tensor of a response.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct OutputTensor {
    pub(crate) name: String,
    pub(crate) shape: Vec<i64>,
    pub(crate) data: OutputData,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn input(shape: &[i64], data: TensorData) -> InputTensor {
        InputTensor {
            name: "t".to_owned(),
            datatype: "INT64".to_owned(),
            shape: shape.to_vec(),
            data,
        }
    }

    fn message(result: Result<impl std::fmt::Debug, ServiceError>) -> String {
        result.expect_err("must be refused").to_string()
    }

    #[test]
    fn datatypes_round_trip_and_have_sizes() {
        for d in Datatype::ALL {
            assert_eq!(Datatype::parse(d.as_str()), Some(d));
        }
        assert_eq!(Datatype::parse("int64"), None, "names are case-sensitive");
        assert_eq!(Datatype::Int64.element_size(), Some(8));
        assert_eq!(Datatype::Fp32.element_size(), Some(4));
        assert_eq!(Datatype::Bytes.element_size(), None);
    }

    #[test]
    fn the_three_forms_decode_to_the_same_values() {
        let values = [1i64, -2, i64::MAX, i64::MIN, 0, 7];
        let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let forms = [
            TensorData::Raw(Bytes::from(raw)),
            TensorData::Json(json!([[1, -2, i64::MAX], [i64::MIN, 0, 7]])),
            TensorData::Json(json!([1, -2, i64::MAX, i64::MIN, 0, 7])),
            TensorData::Typed(Typed::Int64(values.to_vec())),
        ];
        for data in forms {
            assert_eq!(input(&[2, 3], data).into_i64().expect("valid"), values);
        }
        let floats = [0.5f32, -1.25, 3.0e-8, f32::MAX];
        let raw: Vec<u8> = floats.iter().flat_map(|v| v.to_le_bytes()).collect();
        for data in [
            TensorData::Raw(Bytes::from(raw)),
            TensorData::Json(json!([[0.5, -1.25], [3.0e-8, f32::MAX]])),
            TensorData::Typed(Typed::Fp32(floats.to_vec())),
        ] {
            let mut t = input(&[2, 2], data);
            t.datatype = "FP32".to_owned();
            assert_eq!(t.into_f32().expect("valid"), floats);
        }
    }

    #[test]
    fn names_the_tensor_and_the_problem() {
        let cases = [
            (
                message(input(&[2, 3], TensorData::Raw(Bytes::from(vec![0u8; 40]))).into_i64()),
                "t: holds 40 bytes of binary data, but shape [2, 3] of INT64 needs 48 (6 elements × 8 bytes)",
            ),
            (
                message(input(&[2, 3], TensorData::Json(json!([1, 2, 3, 4, 5]))).into_i64()),
                "t: shape [2, 3] holds 6 elements, but the data holds 5",
            ),
            (
                message(input(&[2], TensorData::Json(json!([1, 2.5]))).into_i64()),
                "t: data[1] is 2.5, which is not an INT64 value",
            ),
            (
                message(
                    input(&[2], TensorData::Json(json!([1, 18446744073709551616.0]))).into_i64(),
                ),
                "t: data[1] is 1.8446744073709552e+19, an integer beyond the range of INT64 \
                 (-9223372036854775808 to 9223372036854775807)",
            ),
            (
                message(input(&[1], TensorData::Json(json!(["1"]))).into_i64()),
                "t: data[0] is \"1\", which is not an INT64 value",
            ),
            (
                message(input(&[-1, 3], TensorData::Json(json!([]))).into_i64()),
                "t: shape [-1, 3] has a negative dimension",
            ),
            (
                message(input(&[i64::MAX, i64::MAX], TensorData::Json(json!([]))).into_i64()),
                "t: shape [9223372036854775807, 9223372036854775807] holds too many elements",
            ),
            (
                message(input(&[1], TensorData::Typed(Typed::Fp32(vec![1.0]))).into_i64()),
                "t: contents: INT64 data goes in int64_contents, but the tensor filled fp32_contents",
            ),
            (
                message(input(&[2], TensorData::Typed(Typed::Int64(vec![1]))).into_i64()),
                "t: shape [2] holds 2 elements, but the data holds 1",
            ),
            (
                message(input(&[1], TensorData::Json(json!([1]))).expect_datatype(Datatype::Fp32)),
                "t: datatype INT64, but the model takes FP32",
            ),
            (
                message(input(&[3, 2], TensorData::Json(json!([[1, 2, 3], [4, 5, 6]]))).into_i64()),
                "t: data holds 2 elements, but dimension 0 of shape [3, 2] is 3: send data flat, or nested \
                 exactly as the shape",
            ),
            (
                message(input(&[2, 3], TensorData::Json(json!([[[1, 2, 3, 4, 5, 6]]]))).into_i64()),
                "t: data holds 1 elements, but dimension 0 of shape [2, 3] is 2: send data flat, or nested \
                 exactly as the shape",
            ),
            (
                message(input(&[2, 3], TensorData::Json(json!([[1, 2, 3], [4, 5]]))).into_i64()),
                "t: data[1] holds 2 elements, but dimension 1 of shape [2, 3] is 3: send data flat, or nested \
                 exactly as the shape",
            ),
            (
                message(
                    input(&[2, 3], TensorData::Json(json!([[1, 2, 3], [4, 5, [6]]]))).into_i64(),
                ),
                "t: data[1][2] is an array, but shape [2, 3] has 2 dimensions: send data flat, or nested \
                 exactly as the shape",
            ),
            (
                message(input(&[2, 2], TensorData::Json(json!([[1, 2], 3, 4]))).into_i64()),
                "t: data holds 3 elements, but dimension 0 of shape [2, 2] is 2: send data flat, or nested \
                 exactly as the shape",
            ),
            (
                message(input(&[2, 2], TensorData::Json(json!([[1, 2], 3]))).into_i64()),
                "t: data[1] is 3, where shape [2, 2] nests 2 levels of arrays: send data flat, or nested exactly \
                 as the shape",
            ),
        ];
        for (got, expected) in cases {
            assert_eq!(got, expected);
        }
        let mut t = input(&[1], TensorData::Json(json!([1])));
        t.datatype = "FLOAT".to_owned();
        assert_eq!(
            message(t.expect_datatype(Datatype::Int64)),
            "t: datatype \"FLOAT\" is not a datatype of the protocol (the model takes INT64)"
        );
    }

    #[test]
    fn outputs_encode_little_endian() {
        let data = OutputData::Fp32(vec![1.0, -0.5]);
        assert_eq!(data.datatype(), Datatype::Fp32);
        assert_eq!(
            data.to_le_bytes(),
            [1.0f32.to_le_bytes(), (-0.5f32).to_le_bytes()].concat()
        );
        assert_eq!(
            OutputData::Int64(vec![258]).to_le_bytes(),
            vec![2, 1, 0, 0, 0, 0, 0, 0]
        );
    }
}
