//! Where a command's results go: a file (its directory created when missing) or stdout for `-`, and reports as
//! pretty JSON.

use std::path::Path;

use super::CliError;

/// The error for an I/O failure on `path`.
pub(super) fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> CliError + '_ {
    move |source| CliError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes `text` to `path`, or stdout for '-'.
pub(super) fn write_out(path: &Path, text: &str) -> Result<(), CliError> {
    if path == Path::new("-") {
        println!("{text}");
        Ok(())
    } else {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io_error(dir))?;
        }
        std::fs::write(path, text).map_err(io_error(path))
    }
}

/// A report as pretty JSON.
pub(super) fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string_pretty(value).expect("reports serialize")
}
