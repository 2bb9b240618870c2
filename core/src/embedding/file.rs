//! Opening embedding tables: safetensors files memory-mapped once each, every table's tensor checked against its
//! `model.toml` entry (present, dtype, shape) before anything is served. With [`Preload::Populate`] (`--preload
//! on`, the default) every page is read in at load, so the first requests pay no page faults; a file of
//! [`PROGRESS_BYTES`] or more is read in steps with a log line of the bytes read so far and the rate, so a load of
//! many gigabytes says how far it has got. With [`Preload::OnDemand`] (`--preload off`) pages are read in when a
//! request first touches them, with no read-ahead: ready sooner and with less memory resident, first requests slower.

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use memmap2::{Mmap, MmapOptions};
use safetensors::{Dtype, SafeTensors};

use crate::error::LoadError;
use crate::repository::Storage;
use crate::repository::TableEntry;

/// Bytes of one table (or a shard of it) inside a memory-mapped file. Cheap to clone.
#[derive(Clone)]
pub struct TableBytes {
    map: Arc<Mmap>,
    range: Range<usize>,
}

impl std::fmt::Debug for TableBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableBytes")
            .field("range", &self.range)
            .finish_non_exhaustive()
    }
}

impl TableBytes {
    pub fn as_slice(&self) -> &[u8] {
        &self.map[self.range.clone()]
    }

    /// A sub-range, relative to this view.
    pub(crate) fn slice(&self, range: Range<usize>) -> TableBytes {
        debug_assert!(range.end <= self.range.len());
        TableBytes {
            map: Arc::clone(&self.map),
            range: self.range.start + range.start..self.range.start + range.end,
        }
    }
}

impl AsRef<[u8]> for TableBytes {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

/// When the pages of a mapped file are read in (`--preload`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preload {
    /// All of them at load, before the version is ready.
    Populate,
    /// Each when a request first touches it; the kernel reads no pages ahead of it (random access).
    OnDemand,
}

/// Maps a file of the version (such as an IVF index) read-only, its pages read in as `preload` says, as table
/// files are.
pub fn map_file(path: &Path, preload: Preload) -> Result<Mmap, LoadError> {
    map_table_file(path, preload, PROGRESS_BYTES)
}

fn expected_dtype(storage: Storage) -> Dtype {
    match storage {
        Storage::Fp32 => Dtype::F32,
        Storage::Fp16 => Dtype::F16,
        Storage::Int8 => Dtype::U8,
    }
}

/// Maps every file the tables name and returns each table's bytes, in `entries` order.
pub fn open_tables(
    dir: &Path,
    entries: &[TableEntry],
    preload: Preload,
) -> Result<Vec<TableBytes>, LoadError> {
    let mut maps: HashMap<&str, Arc<Mmap>> = HashMap::new();
    let mut out = Vec::with_capacity(entries.len());
    for entry in entries {
        let path = dir.join(&entry.file);
        let map = match maps.get(entry.file.as_str()) {
            Some(map) => Arc::clone(map),
            None => {
                let map = Arc::new(map_table_file(&path, preload, PROGRESS_BYTES)?);
                maps.insert(&entry.file, Arc::clone(&map));
                map
            }
        };
        let tensors = SafeTensors::deserialize(&map).map_err(|e| {
            LoadError::new(
                &path,
                format!("not a valid safetensors file (truncated or corrupt?): {e}"),
            )
        })?;
        let spec = &entry.spec;
        let view = tensors.tensor(&spec.name).map_err(|_| {
            let mut names = tensors.names();
            names.sort_unstable();
            LoadError::new(
                &path,
                format!(
                    "has no tensor {:?} for table {:?} (tensors in the file: {})",
                    spec.name,
                    spec.name,
                    names.join(", ")
                ),
            )
        })?;
        let dtype = expected_dtype(spec.storage);
        if view.dtype() != dtype {
            return Err(LoadError::new(
                &path,
                format!(
                    "tensor {:?} has dtype {:?}, but model.toml declares storage = \"{}\", which is stored as {dtype:?}",
                    spec.name,
                    view.dtype(),
                    spec.storage.as_str()
                ),
            ));
        }
        let width = match spec.storage {
            Storage::Int8 => spec.dim + 8,
            Storage::Fp32 | Storage::Fp16 => spec.dim,
        };
        let expected = [spec.rows as usize, width];
        if view.shape() != expected {
            return Err(LoadError::new(
                &path,
                format!(
                    "tensor {:?} has shape {:?}, but model.toml declares rows = {}, dim = {} with storage = \"{}\", \
                     which is stored as {expected:?}",
                    spec.name,
                    view.shape(),
                    spec.rows,
                    spec.dim,
                    spec.storage.as_str()
                ),
            ));
        }
        let data = view.data();
        if let Some(bad) = first_non_finite(spec.storage, spec.dim, data) {
            return Err(LoadError::new(
                &path,
                format!(
                    "table {:?} row {}: {} is not a finite number ({}): every score that row enters would be too; \
                     write the table again without it",
                    spec.name, bad.row, bad.what, bad.value
                ),
            ));
        }
        let start = data.as_ptr() as usize - map.as_ptr() as usize;
        if preload == Preload::OnDemand {
            // The check read every page of the table in; give them back, as `--preload off` promises (clean
            // pages of a file, read again if a request touches them).
            // SAFETY: the map is a read-only private map of a file: dropped pages read the same bytes again.
            #[cfg(unix)]
            if let Err(e) = unsafe {
                map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, data.len())
            } {
                tracing::debug!(file = %path.display(), error = %e, "madvise(MADV_DONTNEED) failed");
            }
        }
        out.push(TableBytes {
            map: Arc::clone(&map),
            range: start..start + data.len(),
        });
    }
    Ok(out)
}

/// A value of a table that is not a finite number.
#[derive(Debug, PartialEq)]
struct NonFinite {
    row: usize,
    /// `column 3`, or for an int8 row `its scale` / `its bias`.
    what: String,
    value: f32,
}

/// The first value of a table's bytes (`storage`, `dim` values a row) that is NaN or infinite, if any.
fn first_non_finite(storage: Storage, dim: usize, bytes: &[u8]) -> Option<NonFinite> {
    let at = |i: usize, value: f32| NonFinite {
        row: i / dim,
        what: format!("column {}", i % dim),
        value,
    };
    match storage {
        Storage::Fp32 => {
            let values = bytes.as_chunks::<4>().0;
            let i = first_where(values, |b| {
                u32::from_le_bytes(*b) & 0x7f80_0000 == 0x7f80_0000
            })?;
            Some(at(i, f32::from_le_bytes(values[i])))
        }
        Storage::Fp16 => {
            let values = bytes.as_chunks::<2>().0;
            let i = first_where(values, |b| u16::from_le_bytes(*b) & 0x7c00 == 0x7c00)?;
            Some(at(i, half::f16::from_le_bytes(values[i]).to_f32()))
        }
        Storage::Int8 => {
            // Codes are integers; each row's scale and bias (two f32 after its `dim` codes) may not be finite.
            bytes
                .chunks_exact(dim + 8)
                .enumerate()
                .find_map(|(row, bytes)| {
                    let (params, _) = bytes[dim..].as_chunks::<4>();
                    let (scale, offset) =
                        (f32::from_le_bytes(params[0]), f32::from_le_bytes(params[1]));
                    let (what, value) = if !scale.is_finite() {
                        ("its scale", scale)
                    } else if !offset.is_finite() {
                        ("its bias", offset)
                    } else {
                        return None;
                    };
                    Some(NonFinite {
                        row,
                        what: what.to_owned(),
                        value,
                    })
                })
        }
    }
}

/// The index of the first value for which `bad` holds: blocks are tested whole without a branch (which the
/// compiler vectorises), and only the block that holds one is searched.
fn first_where<const N: usize>(
    values: &[[u8; N]],
    bad: impl Fn(&[u8; N]) -> bool,
) -> Option<usize> {
    const BLOCK: usize = 4096;
    let (block, values) = values
        .chunks(BLOCK)
        .enumerate()
        .find(|(_, block)| block.iter().fold(false, |any, v| any | bad(v)))?;
    Some(block * BLOCK + values.iter().position(bad)?)
}

/// Files at least this large are read in with progress lines.
pub(crate) const PROGRESS_BYTES: u64 = 1 << 30;
/// Bytes read in per step of a large file.
const STEP_BYTES: usize = 256 << 20;
/// The least time between two progress lines of one file.
const REPORT_EVERY: Duration = Duration::from_secs(2);

/// Maps a table file read-only. With [`Preload::Populate`], every page is read in: by the kernel in one call
/// (`MAP_POPULATE`) below `progress_from` bytes, else step by step with a progress line in the log every
/// [`REPORT_EVERY`]. With [`Preload::OnDemand`], none is, and the map is advised for random access.
fn map_table_file(path: &Path, preload: Preload, progress_from: u64) -> Result<Mmap, LoadError> {
    let file =
        File::open(path).map_err(|e| LoadError::cannot_open(path, "cannot open table file", &e))?;
    let len = file
        .metadata()
        .map_err(|e| LoadError::new(path, format!("cannot read the table file's size: {e}")))?
        .len();
    let mut options = MmapOptions::new();
    if preload == Preload::Populate && len < progress_from {
        options.populate();
    }
    // SAFETY: the map is read-only and the model repository is not modified while it is served (new versions go
    // into new directories).
    let map = unsafe { options.map(&file) }
        .map_err(|e| LoadError::new(path, format!("cannot memory-map table file: {e}")))?;
    if preload == Preload::OnDemand {
        // Gathers touch rows scattered over the table: read-ahead around each fault would read (and keep
        // resident) pages no request asked for. Advice is a hint; a kernel that ignores it serves the same bytes.
        #[cfg(unix)]
        if let Err(e) = map.advise(memmap2::Advice::Random) {
            tracing::debug!(file = %path.display(), error = %e, "madvise(MADV_RANDOM) failed");
        }
        return Ok(map);
    }
    if len >= progress_from {
        let started = Instant::now();
        let mut reported = started;
        tracing::info!(file = %path.display(), bytes = len, "reading in a large table file");
        read_in(&map, STEP_BYTES, |done| {
            let now = Instant::now();
            if done == map.len() || now - reported >= REPORT_EVERY {
                reported = now;
                tracing::info!(
                    file = %path.display(),
                    bytes = done,
                    "{}",
                    progress_line(done, map.len(), now - started)
                );
            }
        });
    }
    Ok(map)
}

/// Reads every page of `map` in, `step` bytes at a time, calling `after(bytes read so far)` after each step.
fn read_in(map: &Mmap, step: usize, mut after: impl FnMut(usize)) {
    let mut done = 0;
    while done < map.len() {
        let len = step.min(map.len() - done);
        #[cfg(target_os = "linux")]
        let populated = map
            .advise_range(memmap2::Advice::PopulateRead, done, len)
            .is_ok();
        #[cfg(not(target_os = "linux"))]
        let populated = false;
        if !populated {
            // Kernels before 5.14 have no MADV_POPULATE_READ: fault each page in by reading one byte of it.
            let pages = map[done..done + len].iter().step_by(4096);
            std::hint::black_box(pages.fold(0u8, |acc, &b| acc ^ b));
        }
        done += len;
        after(done);
    }
}

/// `1.25 of 4.00 GiB (31%), 812 MB/s`.
fn progress_line(done: usize, total: usize, elapsed: Duration) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    let rate = done as f64 / elapsed.as_secs_f64().max(1e-9) / 1e6;
    format!(
        "{:.2} of {:.2} GiB ({:.0}%), {rate:.0} MB/s",
        done as f64 / GIB,
        total as f64 / GIB,
        100.0 * done as f64 / total.max(1) as f64
    )
}

/// An I64 tensor of the model repository that is not a table (`[item_features]`, a recall model's popularity
/// order): its values and shape. `what` names what the tensor is for, in messages.
pub fn read_i64_tensor(
    path: &Path,
    tensor: &str,
    what: &str,
) -> Result<(Vec<i64>, Vec<usize>), LoadError> {
    TensorFile::open(path, what)?.i64(tensor, what)
}

/// A safetensors file of the model repository that holds tensors other than tables (`[cooccurrence]`), mapped
/// once to read several of them. `what` names what the file is for, in messages.
#[derive(Debug)]
pub struct TensorFile<'p> {
    path: &'p Path,
    map: Mmap,
}

impl<'p> TensorFile<'p> {
    pub fn open(path: &'p Path, what: &str) -> Result<TensorFile<'p>, LoadError> {
        let file = File::open(path).map_err(|e| {
            LoadError::cannot_open(path, &format!("cannot open the file of {what}"), &e)
        })?;
        // SAFETY: read-only, and the repository is not modified while served (as for embedding tables); the
        // values are copied out before the map is dropped.
        let map = unsafe { Mmap::map(&file) }
            .map_err(|e| LoadError::new(path, format!("cannot memory-map: {e}")))?;
        Ok(TensorFile { path, map })
    }

    /// The values and shape of I64 tensor `tensor`.
    pub fn i64(&self, tensor: &str, what: &str) -> Result<(Vec<i64>, Vec<usize>), LoadError> {
        self.values(tensor, what, Dtype::I64, i64::from_le_bytes)
    }

    /// The values and shape of F32 tensor `tensor`.
    pub fn f32(&self, tensor: &str, what: &str) -> Result<(Vec<f32>, Vec<usize>), LoadError> {
        self.values(tensor, what, Dtype::F32, f32::from_le_bytes)
    }

    fn values<T, const N: usize>(
        &self,
        tensor: &str,
        what: &str,
        dtype: Dtype,
        decode: fn([u8; N]) -> T,
    ) -> Result<(Vec<T>, Vec<usize>), LoadError> {
        let path = self.path;
        let tensors = SafeTensors::deserialize(&self.map).map_err(|e| {
            LoadError::new(
                path,
                format!("not a valid safetensors file (truncated or corrupt?): {e}"),
            )
        })?;
        let view = tensors.tensor(tensor).map_err(|_| {
            let mut names = tensors.names();
            names.sort_unstable();
            LoadError::new(
                path,
                format!(
                    "has no tensor {tensor:?} for {what} (tensors in the file: {})",
                    names.join(", ")
                ),
            )
        })?;
        if view.dtype() != dtype {
            return Err(LoadError::new(
                path,
                format!(
                    "tensor {tensor:?} is {:?} {:?}, but {what} is {dtype:?}",
                    view.dtype(),
                    view.shape()
                ),
            ));
        }
        let values = view
            .data()
            .as_chunks::<N>()
            .0
            .iter()
            .map(|b| decode(*b))
            .collect();
        Ok((values, view.shape().to_vec()))
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn the_first_non_finite_value_is_found_with_its_row_and_column() {
        let (rows, dim) = (3000, 7);
        let fp32 = |poison: &[(usize, f32)]| {
            let mut values: Vec<f32> = (0..rows * dim).map(|i| i as f32 * 0.5 - 100.0).collect();
            for &(at, v) in poison {
                values[at] = v;
            }
            values
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>()
        };
        assert_eq!(first_non_finite(Storage::Fp32, dim, &fp32(&[])), None);
        // Past the first block of 4096 values, the first of two is named.
        let found = first_non_finite(
            Storage::Fp32,
            dim,
            &fp32(&[(2500 * dim + 3, f32::INFINITY), (2900 * dim, f32::NAN)]),
        )
        .expect("found");
        assert_eq!((found.row, found.what.as_str()), (2500, "column 3"));
        assert_eq!(found.value, f32::INFINITY);
        let found = first_non_finite(Storage::Fp32, dim, &fp32(&[(6, f32::NAN)])).expect("found");
        assert_eq!((found.row, found.what.as_str()), (0, "column 6"));
        assert!(found.value.is_nan());

        let fp16: Vec<u8> = (0..rows * dim)
            .map(|i| {
                let v = if i == 17 * dim + 1 {
                    f32::NEG_INFINITY
                } else {
                    i as f32
                };
                half::f16::from_f32(v.min(60000.0))
            })
            .flat_map(|h| h.to_le_bytes())
            .collect();
        let found = first_non_finite(Storage::Fp16, dim, &fp16).expect("found");
        assert_eq!((found.row, found.what.as_str()), (17, "column 1"));
        assert_eq!(found.value, f32::NEG_INFINITY);

        // int8 rows: `dim` codes (any byte is a code), then the scale and the bias.
        let int8_row = |scale: f32, bias: f32| {
            let mut row = vec![0xffu8; dim];
            row.extend_from_slice(&scale.to_le_bytes());
            row.extend_from_slice(&bias.to_le_bytes());
            row
        };
        let mut int8: Vec<u8> = (0..rows).flat_map(|_| int8_row(0.1, -1.0)).collect();
        assert_eq!(first_non_finite(Storage::Int8, dim, &int8), None);
        int8[40 * (dim + 8)..41 * (dim + 8)].copy_from_slice(&int8_row(0.1, f32::NAN));
        let found = first_non_finite(Storage::Int8, dim, &int8).expect("found");
        assert_eq!((found.row, found.what.as_str()), (40, "its bias"));
        int8[9 * (dim + 8)..10 * (dim + 8)].copy_from_slice(&int8_row(f32::INFINITY, 0.0));
        let found = first_non_finite(Storage::Int8, dim, &int8).expect("found");
        assert_eq!((found.row, found.what.as_str()), (9, "its scale"));
    }

    #[test]
    fn a_large_file_is_read_in_step_by_step_with_the_same_bytes() {
        let mut file = tempfile::NamedTempFile::new().expect("temp file");
        let bytes: Vec<u8> = (0..3 * 4096 + 100).map(|i| (i % 251) as u8).collect();
        file.write_all(&bytes).expect("write");
        for progress_from in [0, u64::MAX] {
            for preload in [Preload::Populate, Preload::OnDemand] {
                let map = map_table_file(file.path(), preload, progress_from).expect("map");
                assert_eq!(&map[..], &bytes[..]);
            }
        }
        let map = map_table_file(file.path(), Preload::Populate, u64::MAX).expect("map");
        let mut steps = Vec::new();
        read_in(&map, 4096, |done| steps.push(done));
        assert_eq!(steps, vec![4096, 8192, 12288, 12388]);
    }

    /// Kilobytes of `map` resident in this process, from /proc/self/smaps.
    #[cfg(target_os = "linux")]
    fn resident_kib(map: &Mmap) -> u64 {
        let start = format!("{:x}-", map.as_ptr() as usize);
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("read /proc/self/smaps");
        let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&start));
        assert!(lines.next().is_some(), "the map is not in /proc/self/smaps");
        let rss = lines
            .find(|l| l.starts_with("Rss:"))
            .expect("an Rss line for the map");
        rss.split_whitespace()
            .nth(1)
            .and_then(|kib| kib.parse().ok())
            .expect("Rss in kB")
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn preload_reads_every_page_in_and_on_demand_only_pages_near_a_touch() {
        let pages = 8192;
        let mut file = tempfile::NamedTempFile::new().expect("temp file");
        let bytes: Vec<u8> = (0..pages * 4096).map(|i| (i % 253) as u8).collect();
        file.write_all(&bytes).expect("write");
        file.flush().expect("flush");
        let size_kib = (pages * 4096 / 1024) as u64;
        for progress_from in [0, u64::MAX] {
            let map = map_table_file(file.path(), Preload::Populate, progress_from).expect("map");
            assert_eq!(
                resident_kib(&map),
                size_kib,
                "progress_from {progress_from}"
            );
        }
        let map = map_table_file(file.path(), Preload::OnDemand, u64::MAX).expect("map");
        assert_eq!(resident_kib(&map), 0, "nothing is read in before a touch");
        // Touch one byte of three pages. The kernel maps with each the neighbours it already holds in its page cache
        // (fault-around; on kernels with large page-cache folios, as ext4 has since 6.16, the whole folio around
        // it, up to 2 MiB), but not the rest of the 32 MiB file.
        let touched = [map[0], map[3000 * 4096 + 7], map[8191 * 4096]];
        assert_eq!(
            touched,
            [bytes[0], bytes[3000 * 4096 + 7], bytes[8191 * 4096]]
        );
        let resident = resident_kib(&map);
        assert!(
            (4..=3 * 2048).contains(&resident),
            "{resident} KiB of {size_kib} resident after touching 3 pages"
        );
        assert_eq!(&map[..], &bytes[..]);
    }

    #[test]
    fn progress_lines_say_bytes_share_and_rate() {
        assert_eq!(
            progress_line(1 << 30, 4 << 30, Duration::from_secs(2)),
            "1.00 of 4.00 GiB (25%), 537 MB/s"
        );
        assert_eq!(
            progress_line(0, 0, Duration::ZERO),
            "0.00 of 0.00 GiB (0%), 0 MB/s"
        );
    }
}
