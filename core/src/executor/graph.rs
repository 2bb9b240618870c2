//! One session of a model's dense network, checked against `model.toml` when it is opened: exactly the declared
//! inputs and output, float32, `[B, F, D]` / `[B, N]` → `[B, 1]` with a dynamic batch dimension.
//!
//! A session on a GPU execution provider also takes its embeddings input in GPU memory: [`DenseGraph::device_input`]
//! allocates it with ONNX Runtime's allocator for that GPU, the gather kernel writes into it, and
//! [`DenseGraph::run_device`] binds it through an `IoBinding`, so the batch never goes through host memory.

use std::path::Path;

use ort::memory::{AllocationDevice, Allocator, AllocatorType, MemoryInfo, MemoryType};
use ort::session::{IoBinding, Session};
use ort::value::{Outlet, Tensor, TensorElementType, TensorRef, ValueType};

use super::{Runtime, SessionOptions};
use crate::embedding::DeviceOutput;
use crate::error::LoadError;
use crate::repository::DenseGraphSpec;

/// The sizes `model.toml` declares for the graph's inputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GraphShape {
    /// `F`: categorical fields.
    pub fields: usize,
    /// `D`: values per embedding row.
    pub(crate) dim: usize,
    /// `N`: dense features (0: the graph has no dense input).
    pub dense: usize,
}

/// A validated session of a dense graph. `Session::run` takes `&mut self`, so each executor thread owns one.
pub(crate) struct DenseGraph {
    session: Session,
    embeddings_input: String,
    dense_input: Option<String>,
    output: String,
    shape: GraphShape,
    /// Set when the session runs on a GPU provider: that GPU, its allocator, and the binding runs go through.
    gpu: Option<GpuSession>,
}

struct GpuSession {
    device: usize,
    allocator: Allocator,
    binding: IoBinding,
}

/// An embeddings input `[rows, F, D]` in the GPU memory of a session, to gather into before
/// [`DenseGraph::run_device`].
#[derive(Debug)]
pub(crate) struct DeviceInput {
    tensor: Tensor<f32>,
    rows: usize,
    output: DeviceOutput,
}

impl DeviceInput {
    /// Where the gather writes.
    pub(crate) fn output(&self) -> DeviceOutput {
        self.output
    }
}

impl std::fmt::Debug for DenseGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DenseGraph")
            .field("shape", &self.shape)
            .finish_non_exhaustive()
    }
}

pub(super) fn tensor_type(outlet: &Outlet) -> Option<(TensorElementType, &[i64])> {
    match outlet.dtype() {
        ValueType::Tensor { ty, shape, .. } => Some((*ty, &shape[..])),
        _ => None,
    }
}

fn describe(dims: &[i64]) -> String {
    let dims: Vec<String> = dims
        .iter()
        .map(|&d| if d < 0 { "?".to_owned() } else { d.to_string() })
        .collect();
    format!("[{}]", dims.join(", "))
}

/// Checks one tensor outlet: float32, the expected rank, a dynamic first (batch) dimension, and every fixed
/// dimension after it equal to `expected` (a `None` there accepts any size, e.g. the optional trailing 1).
pub(super) fn check_outlet(
    path: &Path,
    role: &str,
    outlet: &Outlet,
    expected: &[Option<i64>],
) -> Result<(), LoadError> {
    let name = outlet.name();
    let wanted = {
        let dims: Vec<String> = std::iter::once("batch".to_owned())
            .chain(
                expected
                    .iter()
                    .map(|d| d.map_or("any".to_owned(), |d| d.to_string())),
            )
            .collect();
        format!("[{}]", dims.join(", "))
    };
    let Some((ty, dims)) = tensor_type(outlet) else {
        return Err(LoadError::new(
            path,
            format!("{role} {name:?} is not a tensor"),
        ));
    };
    if ty != TensorElementType::Float32 {
        return Err(LoadError::new(
            path,
            format!("{role} {name:?} has element type {ty:?}, but recserve feeds float32"),
        ));
    }
    if dims.len() != expected.len() + 1 {
        return Err(LoadError::new(
            path,
            format!(
                "{role} {name:?} has shape {}, but model.toml implies {wanted}",
                describe(dims)
            ),
        ));
    }
    if dims[0] >= 0 {
        return Err(LoadError::new(
            path,
            format!(
                "{role} {name:?} has a fixed batch dimension of {} (shape {}); it must be dynamic",
                dims[0],
                describe(dims)
            ),
        ));
    }
    for (&got, want) in dims[1..].iter().zip(expected) {
        if let Some(want) = *want
            && got >= 0
            && got != want
        {
            return Err(LoadError::new(
                path,
                format!(
                    "{role} {name:?} has shape {}, but model.toml implies {wanted}",
                    describe(dims)
                ),
            ));
        }
    }
    Ok(())
}

impl DenseGraph {
    /// Opens `<dir>/<spec.file>` and checks it against `spec` and `shape`.
    pub(crate) fn open(
        runtime: &Runtime,
        dir: &Path,
        spec: &DenseGraphSpec,
        shape: GraphShape,
        options: &SessionOptions,
    ) -> Result<DenseGraph, LoadError> {
        let path = dir.join(&spec.file);
        let (session, device) = runtime.session(&path, options)?;

        let dense_input = (shape.dense > 0).then(|| spec.dense_input.clone());
        let mut wanted: Vec<&str> = vec![&spec.embeddings_input];
        wanted.extend(dense_input.as_deref());
        let inputs: Vec<&str> = session.inputs().iter().map(Outlet::name).collect();
        for name in &inputs {
            if !wanted.contains(name) {
                let hint = if *name == spec.dense_input {
                    " (model.toml lists no dense_features or candidate_features, so it would never be fed)"
                } else {
                    ""
                };
                return Err(LoadError::new(
                    &path,
                    format!(
                        "the graph has an input {name:?} that model.toml does not declare{hint}; inputs expected: {wanted:?}"
                    ),
                ));
            }
        }
        for name in &wanted {
            if !inputs.contains(name) {
                return Err(LoadError::new(
                    &path,
                    format!("the graph has no input {name:?} (its inputs: {inputs:?})"),
                ));
            }
        }
        for outlet in session.inputs() {
            if outlet.name() == spec.embeddings_input {
                check_outlet(
                    &path,
                    "input",
                    outlet,
                    &[Some(shape.fields as i64), Some(shape.dim as i64)],
                )?;
            } else {
                check_outlet(&path, "input", outlet, &[Some(shape.dense as i64)])?;
            }
        }
        let outputs: Vec<&str> = session.outputs().iter().map(Outlet::name).collect();
        if outputs != [spec.output.as_str()] {
            return Err(LoadError::new(
                &path,
                format!(
                    "the graph's outputs are {outputs:?}, but model.toml declares exactly one, {:?}",
                    spec.output
                ),
            ));
        }
        let output = &session.outputs()[0];
        let rank = tensor_type(output).map_or(0, |(_, dims)| dims.len());
        let expected: &[Option<i64>] = if rank == 1 { &[] } else { &[Some(1)] };
        check_outlet(&path, "output", output, expected)?;

        let gpu = match device {
            None => None,
            Some(device) => {
                let fail = |e: ort::Error| {
                    LoadError::new(
                        &path,
                        format!("cannot set up GPU input and output binding on cuda:{device}: {e}"),
                    )
                };
                let ordinal = i32::try_from(device)
                    .map_err(|_| fail(ort::Error::new("device ordinal out of range")))?;
                let memory = MemoryInfo::new(
                    AllocationDevice::CUDA,
                    ordinal,
                    AllocatorType::Device,
                    MemoryType::Default,
                )
                .map_err(fail)?;
                let allocator = Allocator::new(&session, memory).map_err(fail)?;
                let mut binding = session.create_binding().map_err(fail)?;
                // Scores come back to host memory; everything before them stays on the GPU.
                binding
                    .bind_output_to_device(spec.output.as_str(), &MemoryInfo::default())
                    .map_err(fail)?;
                Some(GpuSession {
                    device,
                    allocator,
                    binding,
                })
            }
        };

        Ok(DenseGraph {
            session,
            embeddings_input: spec.embeddings_input.clone(),
            dense_input,
            output: spec.output.clone(),
            shape,
            gpu,
        })
    }

    pub(crate) fn shape(&self) -> GraphShape {
        self.shape
    }

    /// The CUDA device whose memory the session reads its embeddings from, or `None` when it runs on the CPU.
    pub(crate) fn cuda_device(&self) -> Option<usize> {
        self.gpu.as_ref().map(|g| g.device)
    }

    /// Allocates the embeddings input for `rows` rows in the session's GPU memory.
    pub(crate) fn device_input(&self, rows: usize) -> Result<DeviceInput, ort::Error> {
        let Some(gpu) = &self.gpu else {
            return Err(ort::Error::new(
                "the session runs on the CPU; it takes host input",
            ));
        };
        let GraphShape { fields, dim, .. } = self.shape;
        let mut tensor = Tensor::<f32>::new(&gpu.allocator, [rows, fields, dim])?;
        let output = DeviceOutput {
            ptr: tensor.data_ptr_mut() as u64,
            len: rows * fields * dim,
            device: gpu.device,
        };
        Ok(DeviceInput {
            tensor,
            rows,
            output,
        })
    }

    /// Runs the rows of `input` (filled by a gather) with `dense` (`[rows, N]`, host memory), through the
    /// session's binding. Replaces `scores` with one score per row.
    pub(crate) fn run_device(
        &mut self,
        input: DeviceInput,
        dense: &[f32],
        scores: &mut Vec<f32>,
    ) -> Result<(), ort::Error> {
        let Some(gpu) = &mut self.gpu else {
            return Err(ort::Error::new(
                "the session runs on the CPU; it takes host input",
            ));
        };
        let rows = input.rows;
        gpu.binding
            .bind_input(self.embeddings_input.as_str(), &input.tensor)?;
        if let Some(name) = &self.dense_input {
            // An owned tensor: ONNX Runtime copies it to the GPU itself, and `ort` need not clone it first.
            let dense = Tensor::from_array(([rows, self.shape.dense], dense.to_vec()))?;
            gpu.binding.bind_input(name.as_str(), &dense)?;
        }
        let outputs = self.session.run_binding(&gpu.binding)?;
        let (_, values) = outputs[self.output.as_str()].try_extract_tensor::<f32>()?;
        if values.len() != rows {
            return Err(ort::Error::new(format!(
                "the graph returned {} values for {rows} rows",
                values.len()
            )));
        }
        scores.clear();
        scores.extend_from_slice(values);
        Ok(())
    }

    /// Runs `rows` rows: `embeddings` is `[rows, F, D]`, `dense` is `[rows, N]`. Replaces `scores` with one
    /// score per row.
    pub(crate) fn run(
        &mut self,
        rows: usize,
        embeddings: &[f32],
        dense: &[f32],
        scores: &mut Vec<f32>,
    ) -> Result<(), ort::Error> {
        let GraphShape {
            fields,
            dim,
            dense: n,
        } = self.shape;
        let emb = TensorRef::from_array_view(([rows, fields, dim], embeddings))?;
        let outputs = match &self.dense_input {
            Some(name) => {
                let dense = TensorRef::from_array_view(([rows, n], dense))?;
                self.session.run(ort::inputs![
                    self.embeddings_input.as_str() => emb,
                    name.as_str() => dense,
                ])?
            }
            None => self
                .session
                .run(ort::inputs![self.embeddings_input.as_str() => emb])?,
        };
        let (_, values) = outputs[self.output.as_str()].try_extract_tensor::<f32>()?;
        if values.len() != rows {
            return Err(ort::Error::new(format!(
                "the graph returned {} values for {rows} rows",
                values.len()
            )));
        }
        scores.clear();
        scores.extend_from_slice(values);
        Ok(())
    }
}
