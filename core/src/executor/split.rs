//! A dense graph split into a user part and an item part (`[dense_graph.split]`): the user graph runs on one row
//! per run of rows that share a user side (every candidate of a `/v1` request has the same user fields and dense
//! features; the worker finds the runs) and gives that run's state `[1, U]`; the item graph runs on every row of
//! the batch with its run's state. The
//! exporter's split (`split_graph.py`) puts the user fields' part of the first MLP layer, their FM sums and their
//! first-order terms in the state, so a request's user side is computed once instead of once per candidate.

use std::path::Path;

use ort::session::Session;
use ort::value::{Outlet, TensorRef};

use super::graph::{check_outlet, tensor_type};
use super::{GraphShape, Runtime, SessionOptions};
use crate::error::LoadError;
use crate::repository::{DenseGraphSpec, SplitSpec};

/// The two sessions of a split graph and their scratch buffers. CPU only: an executor on a GPU runs the whole
/// graph.
pub struct SplitGraph {
    user: Session,
    item: Session,
    embeddings_input: String,
    dense_input: Option<String>,
    state: String,
    output: String,
    shape: GraphShape,
    /// U, the width of a request's state.
    width: usize,
    user_embeddings: Vec<f32>,
    user_dense: Vec<f32>,
    states: Vec<f32>,
}

impl std::fmt::Debug for SplitGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SplitGraph")
            .field("shape", &self.shape)
            .field("width", &self.width)
            .finish_non_exhaustive()
    }
}

fn names(outlets: &[Outlet]) -> Vec<&str> {
    outlets.iter().map(Outlet::name).collect()
}

/// The fixed width of a `[batch, U]` outlet.
fn width_of(path: &Path, role: &str, outlet: &Outlet) -> Result<usize, LoadError> {
    check_outlet(path, role, outlet, &[None])?;
    match tensor_type(outlet).map(|(_, dims)| dims[1]) {
        Some(w) if w > 0 => Ok(w as usize),
        _ => Err(LoadError::new(
            path,
            format!(
                "{role} {:?} must have a fixed width [batch, U]",
                outlet.name()
            ),
        )),
    }
}

impl SplitGraph {
    /// Opens the user and item graphs of `split` in `dir` and checks their interfaces against `spec` and `shape`.
    pub(crate) fn open(
        runtime: &Runtime,
        dir: &Path,
        spec: &DenseGraphSpec,
        split: &SplitSpec,
        shape: GraphShape,
        options: &SessionOptions,
    ) -> Result<SplitGraph, LoadError> {
        let cpu = SessionOptions {
            cuda_device: None,
            ..options.clone()
        };
        let embeddings = [Some(shape.fields as i64), Some(shape.dim as i64)];
        let user_path = dir.join(&split.user_file);
        let (user, _) = runtime.session(&user_path, &cpu)?;
        let dense_input = (shape.dense > 0).then(|| spec.dense_input.clone());
        let mut wanted = vec![spec.embeddings_input.as_str()];
        wanted.extend(dense_input.as_deref());
        if names(user.inputs()) != wanted {
            return Err(LoadError::new(
                &user_path,
                format!(
                    "the user graph's inputs are {:?}, but model.toml implies {wanted:?}",
                    names(user.inputs())
                ),
            ));
        }
        check_outlet(&user_path, "input", &user.inputs()[0], &embeddings)?;
        if let Some(dense) = user.inputs().get(1) {
            check_outlet(&user_path, "input", dense, &[Some(shape.dense as i64)])?;
        }
        if names(user.outputs()) != [split.state.as_str()] {
            return Err(LoadError::new(
                &user_path,
                format!(
                    "the user graph's outputs are {:?}, but [dense_graph.split] declares exactly one, {:?}",
                    names(user.outputs()),
                    split.state
                ),
            ));
        }
        let width = width_of(&user_path, "output", &user.outputs()[0])?;

        let item_path = dir.join(&split.item_file);
        let (item, _) = runtime.session(&item_path, &cpu)?;
        let wanted = [spec.embeddings_input.as_str(), split.state.as_str()];
        if names(item.inputs()) != wanted {
            return Err(LoadError::new(
                &item_path,
                format!(
                    "the item graph's inputs are {:?}, but model.toml implies {wanted:?}",
                    names(item.inputs())
                ),
            ));
        }
        check_outlet(&item_path, "input", &item.inputs()[0], &embeddings)?;
        let item_width = width_of(&item_path, "input", &item.inputs()[1])?;
        if item_width != width {
            return Err(LoadError::new(
                &item_path,
                format!(
                    "the item graph takes {:?} of width {item_width}, but the user graph gives width {width}",
                    split.state
                ),
            ));
        }
        if names(item.outputs()) != [spec.output.as_str()] {
            return Err(LoadError::new(
                &item_path,
                format!(
                    "the item graph's outputs are {:?}, but model.toml declares exactly one, {:?}",
                    names(item.outputs()),
                    spec.output
                ),
            ));
        }
        let output = &item.outputs()[0];
        let rank = tensor_type(output).map_or(0, |(_, dims)| dims.len());
        let expected: &[Option<i64>] = if rank == 1 { &[] } else { &[Some(1)] };
        check_outlet(&item_path, "output", output, expected)?;
        Ok(SplitGraph {
            user,
            item,
            embeddings_input: spec.embeddings_input.clone(),
            dense_input,
            state: split.state.clone(),
            output: spec.output.clone(),
            shape,
            width,
            user_embeddings: Vec::new(),
            user_dense: Vec::new(),
            states: Vec::new(),
        })
    }

    /// Scores `rows` rows (`embeddings` `[rows, F, D]`, `dense` `[rows, N]`) that are consecutive runs of
    /// `requests[i]` rows sharing a user side, then padding up to `rows` (whose scores are discarded): the user
    /// graph on the first row of each run, the item graph on all rows. Replaces `scores` with one score per row.
    pub(crate) fn run(
        &mut self,
        rows: usize,
        embeddings: &[f32],
        dense: &[f32],
        requests: &[usize],
        scores: &mut Vec<f32>,
    ) -> Result<(), ort::Error> {
        let GraphShape {
            fields,
            dim,
            dense: n,
        } = self.shape;
        let row_len = fields * dim;
        // Entries without rows (none reach here today) have no user side to compute.
        let requests: Vec<usize> = requests.iter().copied().filter(|&r| r > 0).collect();
        if requests.iter().sum::<usize>() > rows {
            return Err(ort::Error::new(format!(
                "requests of {requests:?} rows do not fit a batch of {rows} rows"
            )));
        }
        let runs = requests.len().max(1);
        self.user_embeddings.clear();
        self.user_dense.clear();
        let mut at = 0;
        for &count in &requests {
            self.user_embeddings
                .extend_from_slice(&embeddings[at * row_len..(at + 1) * row_len]);
            self.user_dense
                .extend_from_slice(&dense[at * n..(at + 1) * n]);
            at += count;
        }
        if requests.is_empty() {
            // Only padding: any user side will do.
            self.user_embeddings
                .extend_from_slice(&embeddings[..row_len]);
            self.user_dense.extend_from_slice(&dense[..n]);
        }
        let emb = TensorRef::from_array_view(([runs, fields, dim], &self.user_embeddings[..]))?;
        let outputs = match &self.dense_input {
            Some(name) => {
                let dense = TensorRef::from_array_view(([runs, n], &self.user_dense[..]))?;
                self.user.run(ort::inputs![
                    self.embeddings_input.as_str() => emb,
                    name.as_str() => dense,
                ])?
            }
            None => self
                .user
                .run(ort::inputs![self.embeddings_input.as_str() => emb])?,
        };
        let (_, state) = outputs[self.state.as_str()].try_extract_tensor::<f32>()?;
        let width = self.width;
        if state.len() != runs * width {
            return Err(ort::Error::new(format!(
                "the user graph returned {} values for {runs} rows of width {width}",
                state.len()
            )));
        }
        self.states.clear();
        self.states.reserve(rows * width);
        for (i, &count) in requests.iter().enumerate() {
            let row = &state[i * width..(i + 1) * width];
            for _ in 0..count {
                self.states.extend_from_slice(row);
            }
        }
        // Padding rows take the last state: their scores are discarded, any finite state will do.
        while self.states.len() < rows * width {
            let last = &state[(runs - 1) * width..runs * width];
            self.states.extend_from_slice(last);
        }
        drop(outputs);
        let emb = TensorRef::from_array_view(([rows, fields, dim], embeddings))?;
        let states = TensorRef::from_array_view(([rows, width], &self.states[..]))?;
        let outputs = self.item.run(ort::inputs![
            self.embeddings_input.as_str() => emb,
            self.state.as_str() => states,
        ])?;
        let (_, values) = outputs[self.output.as_str()].try_extract_tensor::<f32>()?;
        if values.len() != rows {
            return Err(ort::Error::new(format!(
                "the item graph returned {} values for {rows} rows",
                values.len()
            )));
        }
        scores.clear();
        scores.extend_from_slice(values);
        Ok(())
    }
}
