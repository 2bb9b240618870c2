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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_written_with_its_missing_directories() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("a/b/report.json");
        write_out(&path, "{}").expect("written");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "{}");
        write_out(&path, "[]").expect("replaced");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "[]");
    }

    #[test]
    fn a_path_that_cannot_be_written_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("file");
        std::fs::write(&file, "").expect("write");
        // Its "directory" is a file.
        let err = write_out(&file.join("report.json"), "{}").expect_err("not a directory");
        let CliError::Io { path, .. } = &err else {
            panic!("an I/O error: {err}")
        };
        assert_eq!(path, &file);
        assert!(
            err.to_string()
                .starts_with(&format!("{}: ", file.display())),
            "{err}"
        );
    }

    #[test]
    fn reports_are_pretty_json() {
        assert_eq!(
            to_json(&serde_json::json!({"a": [1]})),
            "{\n  \"a\": [\n    1\n  ]\n}"
        );
    }
}
